"""Saved profiles: where a command's server and credential come from, in which order; a profile's credential going
to its own server only; the file's privacy and atomic writes; and every kind of bad value refused before anything
is written."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bettercompute_cli._profiles import DEFAULT_SERVER, Connection, ProfileError, Profiles, default_path, resolve

A = "http://a.example:3000"
B = "https://b.example"


def _saved(path: Path, **profiles: tuple[str, str]) -> Path:
    store = Profiles.load(path)
    for name, (server, token) in profiles.items():
        store.put(name, server, token)
    return path


def _resolve(path: Path, env: dict[str, str] | None = None, **flags: str | None) -> Connection:
    return resolve(
        server=flags.get("server"), token=flags.get("token"), profile=flags.get("profile"), env=env or {}, path=path
    )


def test_nothing_saved_nothing_set_is_the_local_server_without_a_credential(tmp_path: Path) -> None:
    assert _resolve(tmp_path / "p.toml") == Connection(DEFAULT_SERVER, None)


def test_the_default_profile_is_used_when_nothing_else_says(tmp_path: Path) -> None:
    path = _saved(tmp_path / "p.toml", default=(A, "tok-a"))
    assert _resolve(path) == Connection(A, "tok-a", "default")
    # BETTERCOMPUTE_URL naming the same server keeps the saved credential (dev prints its commands that way).
    assert _resolve(path, {"BETTERCOMPUTE_URL": A + "/"}).token == "tok-a"


def test_an_exported_token_beats_the_default_profile(tmp_path: Path) -> None:
    path = _saved(tmp_path / "p.toml", default=(A, "tok-a"))
    # ... and goes with the server given beside it (or the local one), never to the profile's.
    assert _resolve(path, {"TOKEN": "from-env"}) == Connection(DEFAULT_SERVER, "from-env")
    assert _resolve(path, {"BETTERCOMPUTE_TOKEN": "first", "TOKEN": "second"}).token == "first"
    assert _resolve(path, {"BETTERCOMPUTE_URL": B, "TOKEN": "t"}) == Connection(B, "t")


def test_an_explicit_profile_beats_the_environment_and_flags_beat_everything(tmp_path: Path) -> None:
    path = _saved(tmp_path / "p.toml", default=(A, "tok-a"), prod=(B, "tok-b"))
    env = {"BETTERCOMPUTE_URL": A, "TOKEN": "from-env"}
    assert _resolve(path, env, profile="prod") == Connection(B, "tok-b", "prod")
    assert _resolve(path, {**env, "BETTERCOMPUTE_PROFILE": "prod"}) == Connection(B, "tok-b", "prod")
    assert _resolve(path, env, profile="prod", token="flag") == Connection(B, "flag", "prod")
    assert _resolve(path, env, server=A, token="flag") == Connection(A, "flag")


def test_a_profiles_credential_never_goes_to_another_server(tmp_path: Path) -> None:
    path = _saved(tmp_path / "p.toml", default=(A, "tok-a"), prod=(B, "tok-b"))
    assert _resolve(path, server=B).token is None  # the default profile's credential stays with A
    assert _resolve(path, {"BETTERCOMPUTE_URL": B}).token is None
    assert _resolve(path, profile="prod", server=A).token is None
    assert _resolve(path, profile="prod", server=B + "/").token == "tok-b"


def test_a_damaged_file_does_not_stop_a_command_given_its_server_and_credential(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("not toml [")
    assert _resolve(path, {"BETTERCOMPUTE_URL": A, "TOKEN": "t"}) == Connection(A, "t")
    with pytest.raises(ProfileError):
        _resolve(path)


def test_naming_a_profile_that_is_not_saved_says_how_to_save_it(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"no profile 'prod' in .*better-compute login --profile prod"):
        _resolve(tmp_path / "p.toml", profile="prod")


def test_the_file_is_private_and_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "config" / "bettercompute" / "profiles.toml"
    _saved(path, default=(A, "tok-a"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    inode = path.stat().st_ino
    Profiles.load(path).put("other", B, "tok-b")
    assert path.stat().st_ino != inode  # a new file renamed over the old one, never rewritten in place
    assert sorted(os.listdir(path.parent)) == ["profiles.toml"]  # no temporary file left behind
    assert Profiles.load(path).saved == {"default": (A, "tok-a"), "other": (B, "tok-b")}
    assert not Profiles.load(path).exposed()
    path.chmod(0o644)
    assert Profiles.load(path).exposed()


def test_logout_removes_only_that_profile(tmp_path: Path) -> None:
    path = _saved(tmp_path / "p.toml", default=(A, "tok-a"), prod=(B, "tok-b"))
    assert Profiles.load(path).remove("prod")
    assert not Profiles.load(path).remove("prod")
    assert Profiles.load(path).saved == {"default": (A, "tok-a")}


@pytest.mark.parametrize(
    "text",
    [
        "profiles = 3",
        "[profiles.x]\nserver = 'http://a'",
        "[profiles.x]\nserver = 1\ntoken = 't'",
        "not toml at all [",
    ],
)
def test_a_damaged_file_is_an_error_naming_it(tmp_path: Path, text: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=str(path)):
        Profiles.load(path)


_BAD_TEXT = [
    "",
    "with space",
    "nul\x00byte",
    'quote"d',
    "back\\slash",
    "tab\t",
    "\uff11\uff12",  # full-width digits
    "bidi\u202emark",
    "surrogate\udcff",
    "é",
    "x" * 4097,
]


@pytest.mark.parametrize("bad", _BAD_TEXT)
def test_bad_servers_tokens_and_names_are_refused_and_nothing_is_written(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "p.toml"
    for server, token, name in ((f"http://{bad}", "t", "n"), (A, bad, "n"), (A, "t", bad)):
        with pytest.raises(ProfileError) as refused:
            Profiles.load(path).put(name, server, token)
        assert not bad or bad not in str(refused.value)  # the value itself is not echoed
        assert not path.exists()


@pytest.mark.parametrize("server", ["ftp://a", "a.example:3000", "http://", "http:///path", "file:///etc/passwd"])
def test_only_http_and_https_urls_with_a_host_are_servers(tmp_path: Path, server: str) -> None:
    with pytest.raises(ProfileError):
        Profiles.load(tmp_path / "p.toml").put("default", server, "t")


@given(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters='"\\'), min_size=1))
def test_any_printable_credential_reads_back_as_written(token: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "p.toml"
        Profiles.load(path).put("default", A, token)
        assert Profiles.load(path).saved["default"] == (A, token)


def test_the_file_lives_under_the_config_home(tmp_path: Path) -> None:
    assert default_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "bettercompute" / "profiles.toml"
    assert default_path({"BETTERCOMPUTE_PROFILES": str(tmp_path / "x.toml")}) == tmp_path / "x.toml"
