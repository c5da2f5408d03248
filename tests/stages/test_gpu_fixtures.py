"""The GPU tests' broken bodies, on the CPU: each edit still applies to today's body and the
broken body gets through generate (the body lint), so that on the GPU box the gate under
test, not a stale anchor or the lint, is what stops it. Run only on the box, such fixtures
went stale unseen twice (the embedding body's rows per task; the lint of __device__ globals)."""
import pytest

from conftest import copy_project
from test_gpu import FAULTS, K, break_body
from test_gpu_catalog import LAST_OF_TIES, ROW_ZERO_FOR_BAD_IDS


def generates(project, kernel: str) -> None:
    run = project.scons(f"kernel={kernel}", "stage=generate", check=False)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("fault", FAULTS)
def test_each_rmsnorm_fault_applies_and_generates(tmp_path, fault):
    project = copy_project(tmp_path / "proj")
    break_body(project, fault)
    generates(project, K)


@pytest.mark.parametrize("kernel, edits", [("embedding_v2", ROW_ZERO_FOR_BAD_IDS),
                                           ("argmax_v2", LAST_OF_TIES), ("argmax_fp32_v2", LAST_OF_TIES)])
def test_each_catalog_fault_applies_and_generates(tmp_path, kernel, edits):
    project = copy_project(tmp_path / "proj", kernels=None)      # argmax_fp32_v2 has argmax_v2's body
    for edit in edits:
        project.edit(*edit)
    generates(project, kernel)
