"""GPUs through NVML: what ``nvidia-ml-py`` answers, mapped into the ``gpus`` section, the health ``diag.nvml``
reports and the join claims. No GPU exists here, so the mapping is driven by ``FakeNvml``, a stand-in for the
``pynvml`` module that answers as NVML does on the machines it describes (names and constants as in
nvidia-ml-py 13); the real ``pynvml``, installed in development, is used where a machine without a GPU is tested."""

from __future__ import annotations

import importlib
import queue
import threading
import time
import types
from pathlib import Path
from typing import Any

import attrs
import pytest

from bettercompute_daemon import Inventory
from bettercompute_daemon._inventory import cpu_section, disks_section, memory_section, nics_section
from bettercompute_daemon._nvml import read_nvml
from tests._timing import deadline


class FakeNvmlError(Exception):
    """pynvml's ``NVMLError``: a value, and text of its own."""

    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


NOT_SUPPORTED = FakeNvmlError(3, "Not Supported")


@attrs.define(kw_only=True)
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_bytes: int = 81559 * 1024 * 1024
    minor: int = 0
    ecc_enabled: bool = True
    ecc: dict[tuple[int, int], int] = attrs.field(factory=dict)  # (error type, counter type) -> count
    mig: tuple[int, int] | None = (0, 0)
    retired: dict[int, int] | None = None  # cause -> pages; None: not supported (Ampere and later)
    retired_pending: bool = False
    remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    recovery: int | None = 0
    broken: bool = False
    mig_devices: list[FakeMig] = attrs.field(factory=list)  # by slot; None: an empty slot
    nvlink: tuple[str, ...] = ()  # the UUIDs of the GPUs it reaches over NVLink


@attrs.define(kw_only=True)
class FakeMig:
    uuid: str
    name: str
    memory_bytes: int


class FakeNvml(types.SimpleNamespace):
    """A FAKE of the ``pynvml`` module (nvidia-ml-py) for machines that do not exist here."""

    NVMLError = FakeNvmlError
    NVML_SUCCESS = 0
    NVML_FEATURE_ENABLED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_NOT_FOUND = 6
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0
    NVML_P2P_STATUS_NOT_SUPPORTED = 5
    MAX_MIG_DEVICES = 7
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, gpus: list[FakeGpu], *, init_error: FakeNvmlError | None = None) -> None:
        super().__init__()
        self.gpus = gpus
        self.init_error = init_error
        self.shut_down = False
        self.events: queue.Queue[tuple[FakeGpu, int]] = queue.Queue()  # what the driver would raise: (GPU, XID)
        self.registered: list[FakeGpu] = []
        self.freed = threading.Event()

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, gpu: FakeGpu, types: int, events: object) -> None:
        if gpu.broken:
            raise NOT_SUPPORTED
        assert types == self.nvmlEventTypeXidCriticalError
        self.registered.append(gpu)

    def nvmlEventSetWait_v2(self, events: object, timeout_ms: int) -> Any:
        try:
            gpu, xid = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise FakeNvmlError(self.NVML_ERROR_TIMEOUT, "Timeout") from None
        return types.SimpleNamespace(device=gpu, eventType=self.nvmlEventTypeXidCriticalError, eventData=xid)

    def nvmlEventSetFree(self, events: object) -> None:
        self.freed.set()

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: FakeGpu) -> int:
        return self.MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: FakeGpu, slot: int) -> FakeMig:
        if slot >= len(gpu.mig_devices):
            raise FakeNvmlError(self.NVML_ERROR_NOT_FOUND, "Not Found")
        return gpu.mig_devices[slot]

    def nvmlDeviceGetP2PStatus(self, gpu: FakeGpu, other: FakeGpu, index: int) -> int:
        assert index == self.NVML_P2P_CAPS_INDEX_NVLINK
        if gpu.broken or other.broken:
            raise FakeNvmlError(15, "GPU is lost")
        return self.NVML_P2P_STATUS_OK if other.uuid in gpu.nvlink else self.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetUUID(self, gpu: FakeGpu | FakeMig) -> str:
        if isinstance(gpu, FakeGpu) and gpu.broken:
            raise FakeNvmlError(15, "GPU is lost")
        return gpu.uuid

    def nvmlDeviceGetName(self, gpu: FakeGpu | FakeMig) -> bytes:
        return gpu.name.encode()  # older bindings answer bytes

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu | FakeMig) -> Any:
        return types.SimpleNamespace(total=gpu.memory_bytes, used=0, free=gpu.memory_bytes)

    def nvmlDeviceGetMinorNumber(self, gpu: FakeGpu) -> int:
        return gpu.minor

    def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> Any:
        return types.SimpleNamespace(busId=f"00000000:{0x18 + gpu.minor:02X}:00.0".encode())

    def nvmlDeviceGetSerial(self, gpu: FakeGpu) -> str:
        raise NOT_SUPPORTED

    def nvmlDeviceGetEccMode(self, gpu: FakeGpu) -> list[int]:
        return [int(gpu.ecc_enabled), int(gpu.ecc_enabled)]

    def nvmlDeviceGetTotalEccErrors(self, gpu: FakeGpu, error_type: int, counter_type: int) -> int:
        return gpu.ecc.get((error_type, counter_type), 0)

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> list[int]:
        if gpu.mig is None:
            raise NOT_SUPPORTED
        return list(gpu.mig)

    def nvmlDeviceGetRetiredPages(self, gpu: FakeGpu, cause: int) -> list[int]:
        if gpu.retired is None:
            raise NOT_SUPPORTED
        return [0x1000 * i for i in range(gpu.retired.get(cause, 0))]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, gpu: FakeGpu) -> int:
        if gpu.retired is None:
            raise NOT_SUPPORTED
        return int(gpu.retired_pending)

    def nvmlDeviceGetRemappedRows(self, gpu: FakeGpu) -> tuple[int, int, int, int]:
        if gpu.remapped is None:
            raise NOT_SUPPORTED
        return gpu.remapped

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, fields: list[int]) -> list[Any]:
        assert fields == [self.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        supported = gpu.recovery is not None
        value = types.SimpleNamespace(uiVal=gpu.recovery or 0)
        return [types.SimpleNamespace(nvmlReturn=0 if supported else 3, value=value)]


def test_a_healthy_machine_maps_into_the_gpus_section_claims_and_health() -> None:
    nvml = FakeNvml([FakeGpu(uuid="GPU-a", minor=0), FakeGpu(uuid="GPU-b", minor=1, mig=(1, 1))])
    reading = read_nvml(nvml)
    assert reading is not None and nvml.shut_down
    first, second = reading.gpus
    assert first == {
        "index": 0,
        "uuid": "GPU-a",
        "model": "NVIDIA H100 80GB HBM3",
        "memory_mib": 81559,
        "minor": 0,
        "pci_bus_id": "00000000:18:00.0",
        "serial": None,  # not supported on this card
        "driver_version": "550.54.15",
        "mig": {"current": False, "pending": False},
        "nvlink_peers": [],
        "ecc": {
            "enabled": True,
            "volatile": {"corrected": 0, "uncorrected": 0},
            "aggregate": {"corrected": 0, "uncorrected": 0},
        },
        "retired_pages": None,  # Ampere and later retire no pages: rows are remapped
        "remapped_rows": {"corrected": 0, "uncorrected": 0, "pending": False, "failure": False},
        "recovery_action": "none",
    }
    assert second["mig"] == {"current": True, "pending": True, "devices": []} and second["minor"] == 1
    assert reading.claims == {"gpu_count": 2, "gpu_uuids": ["GPU-a", "GPU-b"], "gpu_model": "NVIDIA H100 80GB HBM3"}
    assert reading.health["healthy"] is True and reading.health["source"] == "nvml"
    assert reading.health["ecc_uncorrectable"] == 0 and reading.health["xid"] is None  # nothing listened for them


def test_errors_retired_pages_and_recovery_actions_make_the_machine_unhealthy() -> None:
    volatile_uncorrected = (1, 0)
    gpus = [
        FakeGpu(uuid="GPU-ecc", ecc={volatile_uncorrected: 2, (0, 1): 40}),
        FakeGpu(uuid="GPU-pages", minor=1, retired={0: 3, 1: 1}, retired_pending=True, remapped=None),
        FakeGpu(uuid="GPU-reset", minor=2, recovery=1),
        FakeGpu(uuid="GPU-rows", minor=3, remapped=(0, 1, 1, 1)),
        FakeGpu(uuid="GPU-lost", minor=4, broken=True),
        FakeGpu(uuid="GPU-old", minor=5, ecc_enabled=False, recovery=None, mig=None, name="Tesla V100"),
    ]
    reading = read_nvml(FakeNvml(gpus))
    assert reading is not None
    health = reading.health
    assert health["healthy"] is False and health["ecc_uncorrectable"] == 2 and health["retired_pages_pending"] is True
    assert [(g["uuid"], g["problems"]) for g in health["gpus"]] == [
        ("GPU-ecc", ["ecc_uncorrectable"]),
        ("GPU-pages", ["retired_pages_pending"]),
        ("GPU-reset", ["recovery_action_gpu_reset"]),
        ("GPU-rows", ["row_remap_failure", "row_remap_pending"]),
        (None, ["unreadable"]),
        ("GPU-old", []),
    ]
    assert reading.gpus[0]["ecc"]["aggregate"] == {"corrected": 40, "uncorrected": 0}
    assert reading.gpus[1]["retired_pages"] == {"single_bit": 3, "double_bit": 1, "pending": True}
    assert reading.gpus[4] == {"index": 4, "error": "GPU is lost"}
    old = reading.gpus[5]
    assert old["ecc"] == {"enabled": False, "volatile": None, "aggregate": None}
    assert old["recovery_action"] is None and old["mig"] is None
    assert reading.claims["gpu_count"] == 6 and "gpu_model" not in reading.claims  # two models: no single claim
    assert "GPU-lost" not in reading.claims["gpu_uuids"]


def test_nvml_that_does_not_start_leaves_no_gpus(tmp_path: Path) -> None:
    assert read_nvml(FakeNvml([], init_error=FakeNvmlError(9, "Driver Not Loaded"))) is None
    inventory = Inventory.load(None, nvml=FakeNvml([], init_error=FakeNvmlError(12, "NVML Shared Library Not Found")))
    assert inventory.sections["gpus"] == [] and inventory.health["healthy"] is True and not inventory.fake


def test_the_machine_inventory_takes_gpus_claims_and_health_from_nvml() -> None:
    inventory = Inventory.load(None, nvml=FakeNvml([FakeGpu(uuid="GPU-a")]))
    assert [g["uuid"] for g in inventory.sections["gpus"]] == ["GPU-a"]
    assert inventory.claims["gpu_count"] == 1 and inventory.claims["gpu_uuids"] == ["GPU-a"]
    assert inventory.health["source"] == "nvml" and inventory.fake is False


def test_the_real_bindings_on_a_machine_without_a_gpu() -> None:
    pynvml = pytest.importorskip("pynvml")  # nvidia-ml-py, in the dev extra
    assert read_nvml(pynvml) is None  # no driver here: NVML does not start, and nothing is raised
    inventory = Inventory.load(None, nvml=importlib.import_module("pynvml"))
    assert inventory.sections["gpus"] == []


def test_cpu_memory_disks_and_nics_from_proc_and_sys(tmp_path: Path) -> None:
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    (proc / "cpuinfo").write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 9654\nphysical id\t: 0\n\n"
        "processor\t: 1\nmodel name\t: AMD EPYC 9654\nphysical id\t: 1\n"
    )
    (proc / "meminfo").write_text("MemTotal:       2113472 kB\nMemFree:  1 kB\n")
    for name, size, rotational in (("nvme0n1", "7501476528", "0"), ("loop0", "8", "0"), ("sda", "100", "1")):
        (sysfs / "block" / name / "queue").mkdir(parents=True)
        (sysfs / "block" / name / "size").write_text(size + "\n")
        (sysfs / "block" / name / "queue" / "rotational").write_text(rotational + "\n")
        (sysfs / "block" / name / "removable").write_text("0\n")
    (sysfs / "block" / "nvme0n1" / "device").mkdir()
    (sysfs / "block" / "nvme0n1" / "device" / "model").write_text("SAMSUNG MZQL27T6HBLA \n")
    for name, hardware in (("eth0", True), ("lo", False)):
        interface = sysfs / "class" / "net" / name
        interface.mkdir(parents=True)
        if hardware:
            (interface / "device").mkdir()
        (interface / "address").write_text("02:00:00:00:00:01\n")
        (interface / "mtu").write_text("9000\n")
        (interface / "speed").write_text("-1\n")  # what a link that is down says
        (interface / "operstate").write_text("down\n")
    cpu = cpu_section(proc)
    assert cpu["model"] == "AMD EPYC 9654" and cpu["sockets"] == 2 and cpu["count"]
    assert memory_section(proc) == {"bytes": 2113472 * 1024}
    assert disks_section(sysfs) == [
        {
            "name": "nvme0n1",
            "bytes": 7501476528 * 512,
            "rotational": False,
            "removable": False,
            "model": "SAMSUNG MZQL27T6HBLA",
            "serial": None,
        },
        {"name": "sda", "bytes": 51200, "rotational": True, "removable": False, "model": None, "serial": None},
    ]
    assert nics_section(sysfs) == [
        {"name": "eth0", "mac": "02:00:00:00:00:01", "mtu": 9000, "speed_mbps": None, "state": "down"}
    ]


def test_this_machine_reports_its_own_cpu_and_memory() -> None:
    inventory = Inventory.load(None, nvml=FakeNvml([], init_error=FakeNvmlError(12, "no library")))
    assert inventory.sections["cpu"]["count"] >= 1 and inventory.sections["memory"]["bytes"] > 0
    assert isinstance(inventory.sections["disks"], list) and isinstance(inventory.sections["nics"], list)


def test_diag_nvml_reads_the_health_again() -> None:
    gpu = FakeGpu(uuid="GPU-a")
    nvml = FakeNvml([gpu])
    inventory = Inventory.load(None, nvml=nvml)
    assert inventory.current_health()["healthy"] is True
    gpu.recovery = 2  # the GPU asks for a reboot after the daemon started
    health = inventory.current_health()
    assert health["healthy"] is False and health["gpus"][0]["problems"] == ["recovery_action_node_reboot"]
    nvml.init_error = FakeNvmlError(9, "Driver Not Loaded")
    assert inventory.current_health() == {"healthy": False, "source": "nvml", "error": "NVML no longer answers"}
    without = Inventory.load(None, nvml=FakeNvml([], init_error=FakeNvmlError(12, "no library")))
    assert without.current_health() == without.health == {"healthy": True, "source": "no NVML on this machine"}


def test_xids_heard_while_running_show_in_the_health() -> None:
    gpu, other = FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", minor=1)
    nvml = FakeNvml([gpu, other, FakeGpu(uuid="GPU-lost", minor=2, broken=True)])
    inventory = Inventory.load(None, nvml=nvml)
    assert inventory.xids is not None and inventory.xids.start()
    try:
        assert nvml.registered == [gpu, other]  # a GPU that cannot report XIDs is skipped, not fatal
        assert inventory.current_health()["xid"] == []
        nvml.events.put((other, 13))  # an application's own fault: recorded, not held against the GPU
        nvml.events.put((gpu, 79))  # fallen off the bus
        ends = time.monotonic() + deadline(10)
        while len(inventory.xids.seen()) < 2:
            assert time.monotonic() < ends
            time.sleep(0.01)
        health = inventory.current_health()
        assert [(x["uuid"], x["xid"]) for x in health["xid"]] == [("GPU-b", 13), ("GPU-a", 79)]
        assert health["healthy"] is False
        assert [(g["uuid"], g["problems"]) for g in health["gpus"]] == [
            ("GPU-a", ["xid_79"]),
            ("GPU-b", []),
            (None, ["unreadable"]),
        ]
    finally:
        inventory.xids.stop()
    assert nvml.freed.wait(deadline(5)) and not inventory.xids.listening


def test_no_xid_listening_without_gpus_that_report_them() -> None:
    nvml = FakeNvml([FakeGpu(uuid="GPU-lost", broken=True)])
    inventory = Inventory.load(None, nvml=nvml)
    assert inventory.xids is not None and inventory.xids.start() is False
    assert nvml.freed.is_set() and inventory.current_health()["xid"] is None


def test_mig_devices_and_nvlink_peers_are_reported_in_the_gpus_section() -> None:
    name = "NVIDIA H100 80GB HBM3"
    slices = [FakeMig(uuid=f"MIG-{n}", name=f"{name} MIG 1g.10gb", memory_bytes=9856 * 1024 * 1024) for n in range(2)]
    odd = FakeMig(uuid="MIG-odd", name="something else", memory_bytes=4 * 1024 * 1024 * 1024)
    gpus = [
        FakeGpu(uuid="GPU-a", mig=(1, 0), mig_devices=[*slices, odd], nvlink=("GPU-b",)),
        FakeGpu(uuid="GPU-b", minor=1, nvlink=("GPU-a", "GPU-c")),
        FakeGpu(uuid="GPU-c", minor=2, mig=None),  # a PCIe card: no MIG, no NVLink
        FakeGpu(uuid="GPU-lost", minor=3, broken=True),
    ]
    reading = read_nvml(FakeNvml(gpus))
    assert reading is not None
    a, b, c, lost = reading.gpus
    assert a["mig"] == {
        "current": True,
        "pending": False,
        "devices": [
            {"uuid": "MIG-0", "profile": "1g.10gb", "memory_mib": 9856},
            {"uuid": "MIG-1", "profile": "1g.10gb", "memory_mib": 9856},
            {"uuid": "MIG-odd", "profile": None, "memory_mib": 4096},  # a name that does not say its profile
        ],
    }
    assert b["mig"] == {"current": False, "pending": False} and c["mig"] is None
    assert [a["nvlink_peers"], b["nvlink_peers"], c["nvlink_peers"]] == [["GPU-b"], ["GPU-a", "GPU-c"], []]
    assert lost == {"index": 3, "error": "GPU is lost"}  # and no other GPU's peers asked about it
    assert reading.health["healthy"] is False  # the lost GPU; MIG and NVLink change nothing to the health
    assert [g["problems"] for g in reading.health["gpus"]] == [[], [], [], ["unreadable"]]


def test_bindings_without_mig_devices_or_p2p_status_leave_them_unknown() -> None:
    nvml = FakeNvml([FakeGpu(uuid="GPU-a", mig=(1, 1)), FakeGpu(uuid="GPU-b", minor=1, nvlink=("GPU-a",))])
    reading = read_nvml(_Without(nvml, {"nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetP2PStatus"}))
    assert reading is not None
    assert reading.gpus[0]["mig"] == {"current": True, "pending": True, "devices": None}
    assert [g["nvlink_peers"] for g in reading.gpus] == [None, None]
    assert reading.health["healthy"] is True


class _Without:
    """``nvml`` as older bindings would be: without the ``missing`` names."""

    def __init__(self, nvml: FakeNvml, missing: set[str]) -> None:
        self._nvml = nvml
        self._missing = missing

    def __getattr__(self, name: str) -> Any:
        if name in self._missing:
            raise AttributeError(name)
        return getattr(self._nvml, name)
