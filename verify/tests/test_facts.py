"""The doctor's facts (mlstack_doctor.facts): the NVIDIA kernel module's version, nvidia-smi's GPU list
and libcuda's version as the linker cache resolves it, read from the texts a real node and container
print (/proc/driver/nvidia/version of a proprietary and an open module, nvidia-smi's recorded answers,
`ldconfig -p`) and real files (libcuda.so.1 linked to its versioned file, as the driver installs it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlstack_doctor.facts import libcuda, nvidia

RECORDED = Path(__file__).resolve().parents[2] / "tests" / "data" / "nvidia-smi"


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Wed Mar 19 14:48:49 UTC 2025\nGCC version:  gcc version 12.2.0\n",
            "570.133.20",
        ),
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n",
            "550.54.14",
        ),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build\n", "580.95.05"),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  \n", None),
        ("", None),
    ],
    ids=["open-x86_64", "proprietary", "open-aarch64", "no-version", "empty"],
)
def test_kernel_module_version(text: str, version: str | None) -> None:
    assert nvidia.kernel_module_version(text) == version


def test_the_recorded_h200_answer_is_eight_gpus() -> None:
    gpus = nvidia.parse_nvidia_smi_csv((RECORDED / "h200.csv").read_text())
    assert [g["index"] for g in gpus] == list(range(8))
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-eb71c47d-a861-7462-3963-1df8cd0f72b0",
        "compute_cap": "9.0",
    }


def test_a_warning_among_the_rows_and_a_comma_in_a_name() -> None:
    text = "WARNING: infoROM is corrupted at gpu 0000:41:00.0\n0, NVIDIA A100, PCIe, GPU-1, 8.0\n"
    assert nvidia.parse_nvidia_smi_csv(text) == [
        {"index": 0, "name": "NVIDIA A100, PCIe", "uuid": "GPU-1", "compute_cap": "8.0"}
    ]


def test_the_query_asks_for_the_columns_the_parser_reads() -> None:
    assert nvidia.NVIDIA_SMI_GPUS[1] == "--query-gpu=index,name,uuid,compute_cap"


def driver_libs(folder: Path, version: str) -> Path:
    """libcuda.so.1 -> libcuda.so.<version>, as the driver installs it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"libcuda.so.{version}").write_bytes(b"\x7fELF")
    (folder / "libcuda.so.1").symlink_to(f"libcuda.so.{version}")
    return folder / "libcuda.so.1"


def ldconfig_p(*paths: Path) -> str:
    lines = [f"\t{p.name} (libc6,x86-64) => {p}\n" for p in paths]
    return (
        f"{len(lines) + 2} libs found in cache `/etc/ld.so.cache'\n"
        + "".join(lines)
        + (
            "\tlibcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12\n"
            "\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6\n"
        )
    )


def test_the_first_libcuda_the_cache_lists_gives_the_version(tmp_path: Path) -> None:
    first = driver_libs(tmp_path / "mlstack-nvidia", "580.95.05")
    second = driver_libs(tmp_path / "lib", "550.54.14")
    text = ldconfig_p(first, second)
    assert libcuda.ldconfig_paths(text) == [str(first), str(second)]
    assert libcuda.cached_version(text) == "580.95.05"


def test_no_libcuda_in_the_cache_and_an_unversioned_file_are_no_version(tmp_path: Path) -> None:
    assert libcuda.cached_version(ldconfig_p()) is None
    plain = tmp_path / "libcuda.so.1"
    plain.write_bytes(b"\x7fELF")  # a copy, not the driver's link: its name carries no version
    assert libcuda.cached_version(ldconfig_p(plain)) is None


def test_ldconfig_of_this_machine_is_read() -> None:
    argv = libcuda.ldconfig_argv()
    assert argv[-1] == "-p" and argv[0] in ("/sbin/ldconfig", "ldconfig")
