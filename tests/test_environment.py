"""What a run records of the software and machine it trained on (summary.json "versions")."""

import platform

import numpy as np
import pytest
import torch

import fedfactor
from fedfactor import environment


@pytest.fixture
def threads():
    """Torch's thread count, put back after the test changes it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_versions_name_the_software_the_machine_and_the_threads_of_a_cpu_run(threads):
    torch.set_num_threads(3)
    assert environment.versions(torch.device("cpu")) == {
        "fedfactor": fedfactor.__version__, "python": platform.python_version(), "torch": torch.__version__,
        "numpy": np.__version__, "platform": platform.platform(), "cpu": environment.cpu_model(), "torch_threads": 3}


def test_a_cuda_run_also_names_its_gpu_and_the_cuda_and_cudnn_builds(monkeypatch):
    named = []

    def device_name(device):
        named.append(device)
        return "NVIDIA H200"

    monkeypatch.setattr(torch.cuda, "get_device_name", device_name)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    found = environment.versions(torch.device("cuda", 1))
    assert (found["gpu"], found["cuda"], found["cudnn"]) == ("NVIDIA H200", "13.0", "91002")
    assert named == [torch.device("cuda", 1)]  # the run's own GPU, not the first one


CPUINFO_X86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz\n\n"
CPUINFO_ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n\n"


def test_the_cpu_model_comes_from_proc_cpuinfo_else_from_platform(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(environment, "CPUINFO", cpuinfo)
    monkeypatch.setattr(platform, "processor", lambda: "aarch64")
    cpuinfo.write_text(CPUINFO_X86)
    assert environment.cpu_model() == "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"
    cpuinfo.write_text(CPUINFO_ARM)  # many ARM kernels name no model
    assert environment.cpu_model() == "aarch64"
    cpuinfo.unlink()  # not Linux
    assert environment.cpu_model() == "aarch64"
