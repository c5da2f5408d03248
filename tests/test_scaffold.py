"""The scaffold: what `create()` writes for each family, and what it refuses (writing nothing).
That every family's output builds through compile is checked in test_catalog.py, inside
the catalog's single scons build."""
import pytest

from conftest import copy_project
from mpkbuild import scaffold
from mpkbuild.stages import load_spec


@pytest.fixture
def tree(tmp_path):
    return copy_project(tmp_path / "proj").root


def snapshot(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("family", list("ABCDE"))
def test_create_writes_three_files_and_a_loadable_spec(tree, family):
    name = f"new_{family.lower()}"
    paths = scaffold.create(tree, name, family)
    rel = sorted(str(p.relative_to(tree)) for p in paths)
    assert rel == sorted([f"specs/{name}.yaml", f"kernels/{name}/{name}.cuh.j2",
                          f"kernels/{name}/reference.py"])
    spec = load_spec(tree / "specs" / f"{name}.yaml", tree)
    assert spec.data["family"] == family and spec.name == name
    regions = spec.data["codegen"]["smem"]["regions"]
    assert (len(regions) == 0) == (family in "DE")
    body = (tree / "kernels" / name / f"{name}.cuh.j2").read_text()
    assert "{{ kernel }}_task" in body and "blockIdx." not in body   # identity comes from the slices


def test_family_letter_is_case_insensitive(tree):
    scaffold.create(tree, "lower_family", "d")
    assert load_spec(tree / "specs" / "lower_family.yaml", tree).data["family"] == "D"


@pytest.mark.parametrize("name, family, phrase", [
    ("rmsnorm_v2", "B", "already exists"),
    ("9lives", "D", "not a C identifier"),
    ("has-dash", "D", "not a C identifier"),
    ("", "D", "not a C identifier"),
    ("../escape", "D", "not a C identifier"),
    ("int", "D", "keyword"),
    ("double__under", "D", "'__'"),
    ("fine_name", "F", "unknown family"),
    ("fine_name", "", "unknown family"),
])
def test_refusals_write_nothing(tree, name, family, phrase):
    before = snapshot(tree)
    with pytest.raises(scaffold.ScaffoldError) as err:
        scaffold.create(tree, name, family)
    assert phrase in str(err.value)
    assert snapshot(tree) == before


def test_existing_kernel_directory_alone_is_refused(tree):
    (tree / "kernels" / "half_made").mkdir()
    before = snapshot(tree)
    with pytest.raises(scaffold.ScaffoldError, match="already exists"):
        scaffold.create(tree, "half_made", "D")
    assert snapshot(tree) == before


def test_second_create_of_the_same_name_is_refused(tree):
    scaffold.create(tree, "twice", "B")
    before = {p: p.read_text() for p in (tree / "kernels" / "twice").iterdir()}
    with pytest.raises(scaffold.ScaffoldError, match="already exists"):
        scaffold.create(tree, "twice", "D")
    assert {p: p.read_text() for p in (tree / "kernels" / "twice").iterdir()} == before


def test_the_scaffold_has_a_wiring_section_and_a_compiled_baseline(tmp_path):
    """A new kernel can be wired and is measured against torch.compile from the start."""
    import yaml
    from mpkbuild import scaffold
    from mpkbuild.stages import load_spec
    root = copy_project(tmp_path / "proj").root
    scaffold.create(root, "gelu_v2", "D")
    spec = load_spec(root / "specs" / "gelu_v2.yaml", root)
    assert spec.data["wiring"]["layer"] == "gelu_v2" and "wiring" in spec.sections
    assert [b for b in spec.data["perf"]["baselines"] if b["compile"]], spec.data["perf"]
    assert yaml.safe_load((root / "specs" / "gelu_v2.yaml").read_text())["codegen"]["threads"] == 128
