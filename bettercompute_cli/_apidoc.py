"""The API reference, ``docs/api.md``, generated from the method registry (never written by hand).

    python -m bettercompute_cli._apidoc           # write docs/api.md
    python -m bettercompute_cli._apidoc --check   # exit 1, with a diff, when docs/api.md is stale

The registry is assembled the way ``better-compute dev`` assembles it (the PostgreSQL store, the embedded IAM, a KMS
key file and node identity, so every optional group is there), which does no I/O: ``better_compute()`` only
validates and registers, so no database is needed. Each method is described from its declaration (path, IAM action,
access, whether it mutates), from the JSON Schema of its input and output (``openapi_document``, the same document
``GET /api/compute/openapi.json`` serves) and from the built-in roles' patterns. ``make docs`` writes the file;
``make lint`` runs the check, as it does for the generated wire code.

The errors a method may answer come from two places. Those that follow from the declaration are exact: every method
decodes its input (``INVALID_INPUT``), an authenticated one checks the credential and the IAM decision
(``UNAUTHENTICATED``, ``ACCESS_DENIED``), a mutating one takes an idempotency key (``CONFLICT``). Those of the
handler itself are found by reading its source: every error class of ``bettercompute.errors`` it constructs, and that
the project's functions it calls by name construct, transitively. Calls through an object (a repository, the store)
are not followed, so that list can miss an error raised deeper; the page says so.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import functools
import inspect
import json
import shlex
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

from bettercompute import BetterCompute, errors
from bettercompute._runtime.codec import decode, encode
from bettercompute._runtime.openapi import openapi_document
from bettercompute._runtime.registry import MethodDef
from bettercompute_iam._policy import builtin_roles, matches

from ._call import EXIT_CODES
from ._config import Config
from ._groups import group_names
from ._runtime import build

__all__ = ["TARGET", "check", "main", "render"]

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "docs" / "api.md"
ENDPOINT = "/api/compute"

_CODES: dict[str, type[errors.ComputeError]] = {
    cls.__name__: cls for cls in errors.ComputeError.__subclasses__() if cls is not errors.InvalidConfigError
}
_NO_NUL = "^[^\\u0000]*$"  # the codec's rule for every string (see codec.json_schema): not worth a line per field
_PROJECT = ("bettercompute", "bettercompute_store_pg", "bettercompute_iam", "bettercompute_metal")


def assemble() -> BetterCompute:
    """The control plane ``dev`` composes, with every optional group on, built without touching anything outside.

    The database URL and the key file are never opened: ``better_compute()`` does no I/O.
    """
    config = Config(
        kms_key_file=Path("/nonexistent/bettercompute-apidoc/kms.key"),
        trust_domain="dev.localhost",
        gateway_address="127.0.0.1:7443",
    )
    compute, _ = build(config, "postgresql://apidoc@127.0.0.1:1/apidoc")
    return compute


# --- the errors a handler constructs --------------------------------------------------------------------------------


def _function_node(fn: Callable[..., Any]) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return node
    return None


def _ours(value: Any) -> bool:
    module = getattr(value, "__module__", None) or ""
    return isinstance(value, types.FunctionType) and module.split(".")[0] in _PROJECT


def _constructed(fn: Callable[..., Any], seen: set[Any]) -> set[str]:
    """The ``ComputeError`` codes ``fn`` constructs, and those the project's functions it calls by name do."""
    fn = inspect.unwrap(fn)
    if fn in seen:
        return set()
    seen.add(fn)
    node = _function_node(fn)
    if node is None:
        return set()
    namespace = {**getattr(fn, "__globals__", {})}
    codes: set[str] = set()
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        target: Any = None
        if isinstance(call.func, ast.Name):
            name = call.func.id
            target = namespace.get(name)
        elif isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
            owner = namespace.get(call.func.value.id)
            name = call.func.attr
            target = getattr(owner, name, None) if isinstance(owner, types.ModuleType) else None
        else:
            continue
        if name in _CODES:
            codes.add(_CODES[name].code)
        elif _ours(target):
            codes |= _constructed(target, seen)
    return codes


def _handler_errors(method: MethodDef[Any, Any]) -> set[str]:
    seen: set[Any] = set()
    codes = _constructed(method.handler, seen)
    if method.admit is not None:
        codes |= _constructed(method.admit, seen)
    return codes


def _declared_errors(method: MethodDef[Any, Any]) -> list[tuple[str, str]]:
    found = [("INVALID_INPUT", "the input does not decode or a field breaks its rule")]
    if method.authenticated:
        found.append(("UNAUTHENTICATED", "no credential, or one that is unknown, expired or revoked"))
        if method.access == "open":
            found.append(("ACCESS_DENIED", "the caller is outside the input's tenant (the tenant pre-check)"))
        else:
            found.append(("ACCESS_DENIED", f"IAM refuses `{method.action}`, or the caller is outside the tenant"))
    if method.mutates:
        found.append(("CONFLICT", "the idempotency key was used with another request"))
    found.append(("UNAVAILABLE", "PostgreSQL (or a central IAM) cannot be reached"))
    found.append(("INTERNAL", "a fault of the server; no detail is given"))
    return found


# --- rendering --------------------------------------------------------------------------------------------------


def _prose(text: str) -> str:
    """A docstring's text as one Markdown paragraph (reStructuredText's double backticks made single)."""
    return " ".join(text.split()).replace("``", "`")


def _description(method: MethodDef[Any, Any]) -> str:
    """The first paragraph of the handler's docstring (``summary`` is only its first line, cut mid-sentence when
    the paragraph goes on)."""
    doc = inspect.getdoc(inspect.unwrap(method.handler)) or method.summary
    return _prose(doc.split("\n\n", 1)[0])


def _first_sentence(text: str) -> str:
    head, dot, _ = text.partition(". ")
    return head + "." if dot else text


def _anchor(group: str, name: str) -> str:
    return f"{group}-{name}"


def _type(schema: dict[str, Any]) -> str:
    """A JSON Schema as a short type: ``string``, ``integer or null``, ``array of [Atom](#type-atom)``, ..."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#type-{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_type(branch) for branch in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of string to {_type(schema['additionalProperties'])}"
    if kind is None:
        return "any JSON value"
    if schema.get("format"):
        return f"{kind} ({schema['format']})"
    return str(kind)


_RULES = (
    ("minLength", "at least {} characters"),
    ("maxLength", "at most {} characters"),
    ("minimum", "at least {}"),
    ("maximum", "at most {}"),
    ("exclusiveMinimum", "more than {}"),
    ("exclusiveMaximum", "less than {}"),
    ("minItems", "at least {} items"),
    ("maxItems", "at most {} items"),
    ("maxProperties", "at most {} entries"),
)


def _rules(schema: dict[str, Any]) -> str:
    parts: list[str] = []
    for branch in schema.get("anyOf", [schema]):
        for key, text in _RULES:
            if key in branch:
                parts.append(text.format(branch[key]))
        pattern = branch.get("pattern")
        if pattern and pattern != _NO_NUL:
            parts.append(f"matches `{pattern}`")
        for key in ("items", "additionalProperties"):
            inner = branch.get(key)
            if isinstance(inner, dict):
                inner_rules = _rules(inner)
                if inner_rules:
                    parts.append(f"each {inner_rules}")
    return "; ".join(parts)


def _default(field: attrs.Attribute[Any]) -> str:
    default: Any = field.default
    if default is attrs.NOTHING:
        return "required"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]  # attrs.Factory is a class at runtime
        default = default.factory()
    try:
        shown = json.dumps(encode(default), ensure_ascii=False)
    except TypeError:
        shown = repr(default)
    return f"default `{shown}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _fields_table(cls: type, schema: dict[str, Any], *, input: bool) -> list[str]:
    properties: dict[str, Any] = schema.get("properties", {})
    if not properties:
        return ["No fields: send `{}`." if input else "No fields."]
    head = "| field | type | required or default | rules |" if input else "| field | type |"
    rows = [head, "|---|---|---|---|" if input else "|---|---|"]
    by_name = {f.name: f for f in attrs.fields(cls)}
    for name, prop in properties.items():
        if input:
            rows.append(f"| `{name}` | {_type(prop)} | {_default(by_name[name])} | {_cell(_rules(prop))} |")
        else:
            rows.append(f"| `{name}` | {_type(prop)} |")
    return rows


# Ids are shown in their real shape with ``...`` for the random part (a valid id: dots are allowed).
_ID_OF_FIELD = {
    "pool_id": "pool_...",
    "node_id": "node_...",
    "principal_id": "pr_...",
    "binding_id": "bd_...",
    "site_id": "site_...",
    "image_id": "img_...",
}
_ID_OF_GROUP = {
    "pools": "pool_...",
    "nodes": "node_...",
    "reservations": "rsv_...",
    "join-tokens": "jt_...",
    "webhooks": "wh_...",
    "devices": "dev_...",
    "sites": "site_...",
    "images": "img_...",
    "metal": "mch_...",
    "instances": "inst_...",
    "keys": "sgk_...",
}
# The fields a valid example needs beyond what the placeholders give: a name of the right shape, one of two fields a
# rule asks for, a nested object. ``render()`` decodes every example, so one that the input would refuse fails it.
_EXAMPLES: dict[str, dict[str, Any]] = {
    "authz.authenticate": {"credential": "bcak_..."},
    "authz.decide": {
        "identity": {
            "principal_id": "pr_...",
            "principal_name": "alice",
            "kind": "user",
            "tenant_id": "acme",
            "is_root": False,
            "credential_id": "0123456789abcdef",
        },
        "action": "compute:pools:get",
        "resource": {"type": "pool", "id": "pool_...", "tenant": "acme", "pool": "pool_..."},
    },
    "bindings.create": {"role": "compute.viewer", "scope_type": "root"},
    "credentials.create": {"expires_in_seconds": 86400},
    "credentials.revoke": {"credential_id": "0123456789abcdef"},
    "pools.create": {"name": "gpus"},
    "principals.create": {"name": "alice@example.com", "kind": "user"},
    "reservations.create": {"gpus": 1, "duration": "PT1H"},
    "reservations.extend": {"duration": "PT30M"},
    "roles.create": {"name": "reservers", "actions": ["compute:reservations:*"]},
    "quotas.set": {"tenant": "root", "max_gpus": 8},
    "quotas.get": {"tenant": "root"},
    "keys.get-rewrap": {"id": "kmr_..."},
    "keys.rewrap": {"columns": ["secrets.sealed_secrets"]},
    "secrets.create": {"name": "registry-password", "scope": "pool:pool_...", "value": "s3cret"},
    "secrets.delete": {"name": "registry-password"},
    "tenants.create": {"name": "acme"},
    "sites.create": {"name": "rack-1"},
    "images.register": {
        "name": "ubuntu-24-04",
        "kind": "disk",
        "url": "https://images.example.com/ubuntu-24.04.img",
        "sha256": "0" * 64,
    },
    "metal.enroll": {
        "bmc": {
            "url": "https://10.0.0.21",
            "username": "admin",
            "password": "bmc-password",
            "pin_sha256": "0" * 64,
        }
    },
    "webhooks.create": {"url": "https://hooks.example.com/bettercompute", "event_types": ["reservation.*"]},
    "instances.create": {
        "name": "web-1",
        "size": {"vcpu": 2, "memory_mib": 2048, "disk_gib": 20},
        "ssh_authorized_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleKeyExampleKeyExampleKey alice@laptop"],
    },
    "instances.resize": {"size": {"vcpu": 4, "memory_mib": 4096, "disk_gib": 40}},
    "instances.usage": {"start": "2030-01-01T00:00:00Z", "end": "2030-02-01T00:00:00Z"},
}


def _placeholder(method: MethodDef[Any, Any], name: str, schema: dict[str, Any]) -> Any:
    """A value to show in an example for a required field: what the field is, never a real id."""
    branch = next((b for b in schema.get("anyOf", [schema]) if b.get("type") != "null"), schema)
    if "enum" in branch:
        return branch["enum"][0]
    kind = branch.get("type")
    if name == "tenant":
        return "root"
    if name in _ID_OF_FIELD:
        return _ID_OF_FIELD[name]
    if name == "id" and method.group in _ID_OF_GROUP:
        return _ID_OF_GROUP[method.group]
    if kind == "integer":
        return max(1, int(branch.get("minimum", 1)))
    if kind == "number":
        return 1
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object" or "$ref" in branch:
        return {}
    if branch.get("format") == "date-time":
        return "2030-01-01T00:00:00Z"
    return f"<{name}>"


def example_input(method: MethodDef[Any, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The example body of ``method``: its required fields, and what ``_EXAMPLES`` adds.

    Raises:
        InvalidInputError: the input refuses the example (a placeholder of the wrong shape, a rule across fields).
    """
    body = {name: _placeholder(method, name, schema["properties"][name]) for name in schema.get("required", [])}
    body.update(_EXAMPLES.get(f"{method.group}.{method.name}", {}))
    decode(method.input, body)
    return body


def _example(method: MethodDef[Any, Any], body: dict[str, Any], has_command: bool) -> list[str]:
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    lines = ["```bash"]
    if has_command:
        options = []
        for name, value in body.items():
            flag = f"--{name.replace('_', '-')}"
            if isinstance(value, bool):
                options.append(flag if value else f"--no-{name.replace('_', '-')}")
            elif isinstance(value, list):
                options.extend(f"{flag} {shlex.quote(str(item))}" for item in value)  # a list option repeats
            elif isinstance(value, dict):
                options.append(f"{flag} {shlex.quote(json.dumps(value, separators=(',', ':')))}")
            else:
                options.append(f"{flag} {shlex.quote(str(value))}")
        lines.append(" ".join(["better-compute", method.group, method.name, *options]))
    lines.append(
        f"curl -X POST -H \"Authorization: Bearer $TOKEN\" -H 'content-type: application/json' "
        f"http://127.0.0.1:3000{ENDPOINT}{method.path} -d {shlex.quote(data)}"
    )
    lines.append("```")
    return lines


def _roles_holding(roles: dict[str, tuple[str, ...]], action: str) -> list[str]:
    return [name for name, patterns in roles.items() if any(matches(p, action) for p in patterns)]


def _method_section(
    method: MethodDef[Any, Any],
    operation: dict[str, Any],
    defs: dict[str, Any],
    roles: dict[str, tuple[str, ...]],
    commands: set[str],
) -> Iterator[str]:
    input_schema = defs[method.input.__name__]
    output_schema = defs[method.output.__name__]
    yield f'<a id="{_anchor(method.group, method.name)}"></a>'
    yield ""
    yield f"### `{method.group}.{method.name}`"
    yield ""
    description = _description(method)
    if description:
        yield description
        yield ""
    yield f"- **Path:** `POST {ENDPOINT}{method.path}`"
    if method.access == "open":
        yield f"- **Action:** `{method.action}` (access `open`: IAM allows it to every authenticated caller)"
    else:
        held = ", ".join(f"`{r}`" for r in _roles_holding(roles, method.action)) or "none"
        yield f"- **Action:** `{method.action}` (access `{method.access}`; built-in roles that hold it: {held})"
    if method.mutates:
        replay = (
            "a retry with the same key and input replays the first answer"
            if method.replayable
            else "its answer holds a one-time secret and is never stored: a retry with the same key is `CONFLICT`"
        )
        yield f"- **Mutates:** yes: audited, and takes an idempotency key (`Idempotency-Key` header); {replay}"
    else:
        yield "- **Mutates:** no"
    if method.admit is not None:
        yield "- **Admission:** request-as-resource `create`: the draft is written before IAM decides on it"
    yield ""
    yield f"**Input** ([{method.input.__name__}](#type-{method.input.__name__.lower()})):"
    yield ""
    yield from _fields_table(method.input, input_schema, input=True)
    yield ""
    yield f"**Output** ([{method.output.__name__}](#type-{method.output.__name__.lower()})), under `data`:"
    yield ""
    yield from _fields_table(method.output, output_schema, input=False)
    yield ""
    yield "**Errors:**"
    yield ""
    for code, why in _declared_errors(method):
        yield f"- `{code}` ({_status(code)}): {why}"
    declared = {code for code, _ in _declared_errors(method)}
    extra = sorted(_handler_errors(method) - declared)
    if extra:
        shown = ", ".join(f"`{code}` ({_status(code)})" for code in extra)
        yield f"- raised by the handler: {shown}"
    yield ""
    yield "**Example:**"
    yield ""
    yield from _example(method, example_input(method, input_schema), method.group in commands)
    yield ""
    assert operation["x-action"] == method.action  # the OpenAPI document describes the same declaration


@functools.cache
def _statuses() -> dict[str, int]:
    return {cls.code: cls.http_status for cls in _CODES.values()}


def _status(code: str) -> int:
    return _statuses()[code]


def _types_section(defs: dict[str, Any], classes: dict[str, type]) -> Iterator[str]:
    yield "## Types"
    yield ""
    yield "Every input and output, and the objects they hold, by name. An input refuses a field it does not list."
    yield ""
    for name in sorted(defs):
        if name == "Error":
            continue
        schema = defs[name]
        yield f'<a id="type-{name.lower()}"></a>'
        yield ""
        yield f"### {name}"
        yield ""
        if schema.get("description"):
            yield _prose(schema["description"])
            yield ""
        cls = classes.get(name)
        properties: dict[str, Any] = schema.get("properties", {})
        if not properties:
            yield "No fields."
            yield ""
            continue
        required = set(schema.get("required", []))
        yield "| field | type | required or default | rules |"
        yield "|---|---|---|---|"
        for field, prop in properties.items():
            if cls is not None and attrs.has(cls):
                when = _default(attrs.fields_dict(cls)[field])
            else:
                when = "required" if field in required else "optional"
            yield f"| `{field}` | {_type(prop)} | {when} | {_cell(_rules(prop))} |"
        yield ""


def _classes(compute: BetterCompute) -> dict[str, type]:
    """Every attrs class the methods reach, by name (as the JSON Schema names them)."""
    found: dict[str, type] = {}

    def visit(tp: Any) -> None:
        if isinstance(tp, type) and attrs.has(tp):
            if tp.__name__ in found:
                return
            found[tp.__name__] = tp
            for hint in _hints(tp).values():
                visit(hint)
            return
        for arg in getattr(tp, "__args__", ()):
            visit(arg)

    for method in compute.registry.methods():
        visit(method.input)
        visit(method.output)
    return found


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def render() -> str:
    """The whole of ``docs/api.md``."""
    compute = assemble()
    document = openapi_document(compute.registry, ENDPOINT)
    defs: dict[str, Any] = document["components"]["schemas"]
    roles = builtin_roles(compute.registry)
    commands = set(group_names())
    methods = list(compute.registry.methods())
    lines = [
        "# API reference",
        "",
        "<!-- Generated by `python -m bettercompute_cli._apidoc` (`make docs`) from the method registry; do not "
        "edit by hand. `make lint` fails when it is stale. -->",
        "",
        f"Every method of a control plane composed as `better-compute dev` composes it ({len(methods)} methods: "
        "the core, the PostgreSQL store's modules, the embedded IAM, the webhooks and secrets groups, which need a "
        "KMS key, and node identity, which needs a trust domain and a gateway address). A control plane composed "
        "with fewer options has fewer groups: without a KMS key there is no `webhooks` or `secrets` group, without "
        "node identity (a KMS key, a trust domain and a gateway address) no `nodes` or `devices` group; behind a "
        "central IAM (`iam_url`) the IAM groups answer `NOT_FOUND`.",
        "",
        f"Every method is `POST {ENDPOINT}/<group>/<method>` with a JSON object as the body (an empty body reads as "
        '`{}`) and `Authorization: Bearer <credential>`. The answer is `{"data": <output>}` with status 200, or '
        '`{"error": {"code", "message", "details", "retryable"}}` with the status of its code. The same document as '
        f"OpenAPI 3.1 is served at `GET {ENDPOINT}/openapi.json`. The client command `better-compute <group> "
        "<method>` takes one option per input field (`--pool-id` for `pool_id`; `--json '{...}'` for the whole "
        "input) and exits with a status per error code (below; 2 for a usage error). The IAM `authz` group "
        "has no client command: it is what a process behind a central IAM calls.",
        "",
        "## Errors",
        "",
        "Under each method, the codes with a reason follow from its declaration and hold for every such "
        "method. The line *raised by the handler* is found by reading the handler's source and the functions of the "
        "project it calls by name; an error raised further down (inside the store, say) can be missing from it.",
        "",
        "| code | HTTP status | exit status of `better-compute <group> <method>` |",
        "|---|---|---|",
        *(f"| `{code}` | {status} | {EXIT_CODES.get(code, 1)} |" for code, status in sorted(_statuses().items())),
        "",
        "## Examples",
        "",
        "Each method's example sends its required fields, and a few others where the input needs them, with "
        "placeholders of the right shape (`pool_...`: put a real id there; `root` is the root tenant's id). Every "
        "example is an input the method accepts: the generator decodes each one.",
        "",
        "## Methods",
        "",
    ]
    for spec in compute.registry.groups():
        links = ", ".join(
            f"[`{m.name}`](#{_anchor(spec.name, m.name)})" for m in compute.registry.methods() if m.group == spec.name
        )
        description = _first_sentence(_prose(spec.description or ""))
        lines.append(f"- **{spec.name}** (module `{compute.registry.owner(spec.name)}`): {description} {links}")
    lines.append("")
    current = None
    for method in methods:
        if method.group != current:
            current = method.group
            group = compute.registry.group(current)
            lines.append(f"## {current}")
            lines.append("")
            if group is not None and group.description:
                lines.append(_prose(group.description))
                lines.append("")
        operation = document["paths"][f"{ENDPOINT}{method.path}"]["post"]
        lines.extend(_method_section(method, operation, defs, roles, commands))
    lines.extend(_types_section(defs, _classes(compute)))
    return "\n".join(lines).rstrip("\n") + "\n"


def check(target: Path | None = None) -> int:
    """0 when ``target`` (``docs/api.md``) is what ``render()`` makes now, else 1 with a diff on stderr."""
    path = target if target is not None else TARGET
    fresh = render()
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    if current == fresh:
        return 0
    diff = difflib.unified_diff(
        current.splitlines(keepends=True), fresh.splitlines(keepends=True), str(path), "generated now", n=1
    )
    sys.stderr.writelines(list(diff)[:200])
    sys.stderr.write(f"\n{path} is stale: run `make docs` (python -m bettercompute_cli._apidoc) and commit it\n")
    return 1


def main(argv: list[str] | None = None) -> int:
    """Write ``docs/api.md``, or with ``--check`` compare it with what would be written."""
    parser = argparse.ArgumentParser(prog="python -m bettercompute_cli._apidoc", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff when docs/api.md is stale")
    args = parser.parse_args(argv)
    if args.check:
        return check()
    TARGET.parent.mkdir(exist_ok=True)
    TARGET.write_text(render(), encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
