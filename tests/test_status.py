"""Status and the exact dry run: for every edit in a corpus, the actions `scons -n` lists,
the nodes status calls stale and the actions the real build executes are the same set."""
import json
import os
import stat
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.nvcc

K = "rmsnorm_v2"
SPEC = f"specs/{K}.yaml"
GPU = "fake-gpu-sm90"


def status_json(p, *args, **kw):
    run = p.scons("status", "--json", *args, **kw)
    return json.loads(run.stdout)


def stale_set(p, *args, **kw):
    return {n["label"] for n in status_json(p, *args, **kw)["nodes"] if n["will_run"]}


def dry_run_set(p, *args, **kw):
    return set(p.scons("-n", *args, **kw).stdout.split("\n")) - {""}


def edit_spec(old, new):
    return lambda p: p.edit(SPEC, old, new)


def touch_all(p):
    future = time.time() + 100
    for rel in (SPEC, f"kernels/{K}/{K}.cuh.j2", f"kernels/{K}/reference.py"):
        os.utime(p.root / rel, (future, future))


def fake_nvcc(p):
    """A newer nvcc on PATH: same compiler, another version string."""
    tool = p.root / "fake-bin" / "nvcc"
    tool.parent.mkdir()
    real = os.popen("command -v nvcc").read().strip()
    tool.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then "{real}" --version | sed s/V13/V99/; '
                    f'else exec "{real}" "$@"; fi\n')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{tool.parent}:{os.environ['PATH']}"}


def kept_mtime_edit(rel, old, new):
    """A same-size edit with the file's mtime put back (what `cp -p`, `rsync -t` or a
    restored cache do): only the bytes tell."""
    assert len(old) == len(new)

    def apply(p):
        st = os.stat(p.path(rel))
        p.edit(rel, old, new)
        os.utime(p.path(rel), ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.stat(p.path(rel)).st_size == st.st_size
    return apply


PKG = "site_scons/mpkbuild"


def append(rel, text):
    return lambda p: p.path(rel).write_text(p.path(rel).read_text() + text)


def run_node_no_op(p):
    """A no-op statement in the one function every node's SCons action is: SCons used to
    sign that function by its compiled code, so the build re-ran everything while -n and
    status said fresh."""
    p.edit("site_scons/mpkbuild/site_tools/mpk.py", "    build = _BUILD[0]\n", "    _probe = 0\n    build = _BUILD[0]\n")


def docstring_edit(p):
    p.edit(f"{PKG}/stages/generate/__init__.py", '"""The generate stage:', '"""The generate stage (reworded):')


CORPUS = {
    "codegen param": edit_spec("eps: 1.0e-6", "eps: 1.0e-5"),
    "codegen variant": edit_spec("decode_r8_h4096:    {rows: 8,", "decode_r8_h4096:    {rows: 4,"),
    "generators": edit_spec("weight: {dist: uniform, low: 0.5", "weight: {dist: uniform, low: 0.25"),
    "validate": edit_spec("rel_max: 3.0e-2", "rel_max: 2.0e-2"),
    "perf": edit_spec("repeats: 7", "repeats: 9"),
    "wiring": edit_spec("test_variant: decode_r8_h4096", "test_variant: decode_r16_h4096"),
    "comment only": edit_spec("# one fp32 partial per warp", "# reworded"),
    "body": lambda p: p.edit(f"kernels/{K}/{K}.cuh.j2", "// One task = RPT consecutive rows", "// One task, RPT consecutive rows"),
    "body comment at end": lambda p: p.path(f"kernels/{K}/{K}.cuh.j2").write_text(
        p.path(f"kernels/{K}/{K}.cuh.j2").read_text() + "// trailing note\n"),
    "reference": lambda p: p.edit(f"kernels/{K}/reference.py", '"""Called with float64', '"""Called (edited) with float64'),
    "wiring template": lambda p: p.edit("site_scons/mpkbuild/data/wiring/templates/layer.py.j2", "{{", "{{ "),
    "harness template": lambda p: p.edit("site_scons/mpkbuild/templates/harness.cu.j2", "// harness.cu:", "// harness.cu (edited):"),
    # a stage's own part of the review (its row's report): the review renders it
    "review part": append(f"{PKG}/stages/validate/review.md.j2", "\n"),
    "touch": touch_all,
    "body, same size, mtime kept": kept_mtime_edit(f"kernels/{K}/{K}.cuh.j2", "// One task = RPT consecutive rows",
                                                   "// One task = RPT consecutive ROWS"),
    "reference, same size, mtime kept": kept_mtime_edit(f"kernels/{K}/reference.py", '"""Called with float64',
                                                        '"""CALLED with float64'),
    "spec, same size, mtime kept": kept_mtime_edit(SPEC, "rel_max: 3.0e-2", "rel_max: 2.0e-2"),
    "render-neutral codegen edit": edit_spec("family: B", "family: C"),
    # the tool's own code: comments and docstrings re-run nothing, behaviour re-runs what
    # its import closure reaches, the plumbing and the action function nothing
    "runner comment": append(f"{PKG}/runners/perf.py", "\n# a note\n"),
    "stage module comment": append(f"{PKG}/stages/compile.py", "\n# a note\n"),
    "stage module docstring": docstring_edit,
    "runner behaviour": append(f"{PKG}/runners/validate.py", "\n_edited_by_the_test = 1\n"),
    "judge behaviour": append(f"{PKG}/stages/perf/judge.py", "\n_edited_by_the_test = 1\n"),
    "util behaviour": append(f"{PKG}/util/expr.py", "\n_edited_by_the_test = 1\n"),
    "stage module behaviour": append(f"{PKG}/stages/review.py", "\n_edited_by_the_test = 1\n"),
    "plumbing behaviour": append(f"{PKG}/cli.py", "\n_edited_by_the_test = 1\n"),
    "action function no-op": run_node_no_op,
    "action version": lambda p: p.edit(f"{PKG}/util/closure.py", 'ACTION_VERSION = "mpkbuild action',
                                       'ACTION_VERSION = "mpkbuild action 99 -'),
    "generated file edited by hand": append(f"build/{K}/gen/{K}.cuh", "// hand edit\n"),
    "resources edited by hand": lambda p: p.edit(f"build/{K}/sm_90a/resources.json", '"registers": ',
                                                 '"registers": 1'),
    "unrelated file in wiring/": lambda p: p.path("site_scons/mpkbuild/data/wiring/NOTES.md").write_text("notes\n"),
}
NOTHING = {"comment only", "touch", "runner comment", "stage module comment", "stage module docstring",
           "plumbing behaviour", "action function no-op", "unrelated file in wiring/"}
EVERY = {f"spec {K}", f"generate {K} {K}_spec.h", f"generate {K} {K}.cuh", f"generate {K} harness.cu",
         f"compile {K} sm_90a", f"compile {K} sm_100a", f"wire {K}", f"validate {K} {GPU}",
         f"perf {K} {GPU}", f"bandwidth {GPU}", f"review {K}", "review summary"}
MUST_RUN = {"body, same size, mtime kept": {f"generate {K} {K}.cuh", f"compile {K} sm_90a"},
            "runner behaviour": {f"validate {K} {GPU}"},
            "judge behaviour": {f"perf {K} {GPU}"},
            "util behaviour": {f"generate {K} {K}_spec.h", f"compile {K} sm_90a", f"validate {K} {GPU}"},
            "stage module behaviour": {f"review {K}"},
            "review part": {f"review {K}"},
            "action version": EVERY,
            "generated file edited by hand": {f"generate {K} {K}.cuh"},
            "resources edited by hand": {f"compile {K} sm_90a"},
            "reference, same size, mtime kept": {f"validate {K} {GPU}"},
            "spec, same size, mtime kept": {f"spec {K}", f"validate {K} {GPU}"}}


# what each edit may re-run at most (the rest of EVERY must stay as it is)
NEVER_BEYOND = {
    "runner behaviour": {f"validate {K} {GPU}", f"review {K}", "review summary"},
    "judge behaviour": {f"perf {K} {GPU}", f"review {K}", "review summary"},
    "stage module behaviour": {f"review {K}", "review summary"},
    "review part": {f"review {K}", "review summary"},
    "generated file edited by hand": {f"generate {K} {K}.cuh"},
    "resources edited by hand": {f"compile {K} sm_90a", f"validate {K} {GPU}", f"perf {K} {GPU}",
                                 f"review {K}", "review summary"},
}


@pytest.mark.parametrize("case", list(CORPUS) + ["toolchain"])
def test_dry_run_status_and_build_agree(built, case):
    env = {}
    if case == "toolchain":
        env = fake_nvcc(built)
    else:
        CORPUS[case](built)
    predicted = dry_run_set(built, "stage=review", env=env)
    assert predicted == stale_set(built, "stage=review", env=env)
    executed = set(built.scons("stage=review", env=env).actions)
    assert predicted == executed, f"dry run {sorted(predicted)} != executed {sorted(executed)}"
    assert stale_set(built, "stage=review", env=env) == set()
    if case in NOTHING:
        assert executed == set()
    assert MUST_RUN.get(case, set()) <= executed, executed
    # no over-staleness: what a change cannot reach does not run
    assert executed <= NEVER_BEYOND.get(case, EVERY), executed - NEVER_BEYOND.get(case, EVERY)
    if case == "generated file edited by hand":
        assert "hand edit" not in built.path(f"build/{K}/gen/{K}.cuh").read_text()
    if case == "toolchain":
        assert f"compile {K} sm_90a" in executed and f"validate {K} {GPU}" in executed


def test_reasons_are_concrete(built):
    built.edit(SPEC, "rel_max: 3.0e-2", "rel_max: 2.0e-2")
    built.edit(f"kernels/{K}/{K}.cuh.j2", "// One task = RPT consecutive rows", "// One task, RPT consecutive rows")
    nodes = {n["label"]: n for n in status_json(built)["nodes"]}
    assert "spec field `validate.rel_max` changed 0.03 -> 0.02" in nodes[f"validate {K} {GPU}"]["reasons"]
    assert f"kernels/{K}/{K}.cuh.j2 changed" in nodes[f"generate {K} {K}.cuh"]["reasons"]
    assert f"upstream compile {K} sm_90a will run" in nodes[f"validate {K} {GPU}"]["reasons"]
    assert nodes[f"validate {K} {GPU}"]["state"] == "stale"
    text = built.scons("status").stdout
    assert "validate@gpu" in text and "spec field `validate.rel_max` changed 0.03 -> 0.02" in text


def test_toolchain_change_is_named(built):
    env = fake_nvcc(built)
    nodes = {n["label"]: n for n in status_json(built, env=env)["nodes"]}
    reason = nodes[f"compile {K} sm_90a"]["reasons"][0]
    assert reason.startswith("nvcc 13.") and "-> nvcc 99." in reason


def test_other_gpu_profile_gates_never_run_and_stale_only_there(built):
    nodes = {n["label"]: n for n in status_json(built, env={"FAKE_GPU_NAME": "Fake GPU Two"})["nodes"]}
    other = "fake-gpu-two-sm90"
    assert nodes[f"validate {K} {other}"]["state"] == "never run"
    assert nodes[f"compile {K} sm_90a"]["state"] == "fresh"


def test_status_without_gpu_says_pending_and_exits_zero(built):
    run = built.scons("status", "kernel=rmsnorm_v2", fake_gpu=False)
    assert run.returncode == 0
    assert "pending" in run.stdout and "no GPU of this profile here" in run.stdout
    assert GPU in run.stdout   # points at the profile that has results


def test_status_filters_by_stage(built):
    built.edit(SPEC, "rel_max: 3.0e-2", "rel_max: 2.0e-2")
    labels = {n["label"] for n in status_json(built, "stage=compile")["nodes"]}
    assert f"validate {K} {GPU}" not in labels and f"compile {K} sm_90a" in labels


def test_check_passes_when_fresh_and_fails_listing_stale_gates(built):
    (built.root / "gpu_profiles").mkdir()
    profile = json.loads((built.root / "build" / "gpu" / GPU / "bandwidth.json").read_text())["gpu"]
    (built.root / "gpu_profiles" / f"{GPU}.json").write_text(json.dumps(profile))
    ok = built.scons("check", f"gpu={GPU}", fake_gpu=False)
    assert "is fresh" in ok.stdout
    built.edit(SPEC, "rel_max: 3.0e-2", "rel_max: 2.0e-2")
    bad = built.scons("check", f"gpu={GPU}", fake_gpu=False, check=False)
    assert bad.returncode == 1
    assert f"validate {K} {GPU}: pending" in bad.stderr and "validate.rel_max" in bad.stderr


def test_check_refuses_unknown_profile(built):
    run = built.scons("check", "gpu=nvidia-b300-sm103", fake_gpu=False, check=False)
    assert run.returncode != 0 and "no such GPU profile" in run.stderr
    assert "nvidia-b200-sm100" in run.stderr          # the shipped profiles are named


def test_why_lists_what_a_field_or_file_would_touch(built):
    run = built.scons("why=validate.rel_max")
    # wire reads validate too: the installed test-mode test compares with its limits
    # and so do the tune stage's trials (each candidate validates), then the pick
    lines = [l for l in run.stdout.splitlines() if l.startswith("  ")]
    assert [l for l in lines if not l.startswith(("  trial ", "  tune "))] == [
        f"  wire {K}", f"  validate {K} {GPU}", f"  review {K}", "  review summary"]
    # 26 candidates (rows a task 1, 2, 4, 8 where the rows take them: one at r1) and the spec
    # config of each of the 6 variants with a choice again
    assert sum(l.startswith(f"  trial {K} ") for l in lines) == 32 and f"  tune {K} {GPU}" in lines
    assert sum(" again " in l for l in lines) == 6
    # its tune picks inside MPK (tune.figure: runtime): without mpk_root= it says so
    assert "tune.figure: runtime times candidates inside MPK: without mpk_root=" in run.stdout
    run = built.scons(f"why=kernels/{K}/{K}.cuh.j2")
    assert f"  compile {K} sm_100a" in run.stdout and f"  perf {K} {GPU}" in run.stdout
    assert f"  spec {K}" not in run.stdout
    bad = built.scons("why=not a thing!", check=False)
    assert bad.returncode != 0 and "not a file in the graph nor a spec field" in bad.stderr
    bad = built.scons("why=nosection.x", check=False)
    assert bad.returncode != 0 and "is not a spec section" in bad.stderr
    for query in ("validate.nonsense", f"{K}:perf.nonsense", "codegen.template_params[99]"):
        bad = built.scons(f"why={query}", check=False)
        assert bad.returncode != 0 and "actions" not in bad.stdout, bad.stdout
        assert f"no requested spec has the field {query.split(':')[-1]!r}" in bad.stderr
    run = built.scons("why=codegen.template_params[0]")
    assert f"  compile {K} sm_100a" in run.stdout


def test_dag_writes_dot_and_mermaid_coloured_by_status(built):
    built.edit(SPEC, "rel_max: 3.0e-2", "rel_max: 2.0e-2")
    run = built.scons("dag", f"kernel={K}", "stage=validate")
    dot = (built.root / "build" / "dag" / f"{K}-validate.dot").read_text()
    mmd = (built.root / "build" / "dag" / f"{K}-validate.mmd").read_text()
    assert f'"compile {K} sm_90a" -> "validate {K} {GPU}"' in dot
    assert "perf" not in dot                                   # not needed for validate
    assert "stale" in dot and "#ffd28a" in dot and "(pass)" in dot
    assert mmd.startswith("flowchart LR") and "classDef stale" in mmd
    assert "wrote build/dag/" in run.stdout


def test_unknown_names_are_refused_before_anything(built):
    run = built.scons("status", "kernel=nope", check=False)
    assert run.returncode != 0 and "unknown kernel nope" in run.stderr


def test_shared_cache_second_clone_rebuilds_nothing_and_checks_without_gpu(tmp_path):
    from conftest import copy_project
    cache = tmp_path / "cache"
    first = copy_project(tmp_path / "one")
    first.scons("stage=review", f"cache={cache}")
    # the first clone's GPU profile travels with the project (as a committed file would)
    profile = json.loads((first.root / "build" / "gpu" / GPU / "bandwidth.json").read_text())["gpu"]
    second = copy_project(tmp_path / "two")
    (second.root / "gpu_profiles").mkdir()
    (second.root / "gpu_profiles" / f"{GPU}.json").write_text(json.dumps(profile))
    # no GPU at all here: every result must come from the cache or the build fails
    run = second.scons("stage=review", f"cache={cache}", f"gpu={GPU}", fake_gpu=False)
    assert run.actions == [], run.stdout
    assert "Retrieved" in run.stdout
    assert not second.runs_file.exists()
    second.scons("check", f"gpu={GPU}", fake_gpu=False)
    # another GPU never takes those results: its gates run
    third = copy_project(tmp_path / "three")
    run = third.scons("stage=review", f"cache={cache}", env={"FAKE_GPU_NAME": "Fake GPU Two"})
    assert f"validate {K} fake-gpu-two-sm90" in run.actions


def test_unusable_cache_folder_is_one_clear_error(project, tmp_path):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    run = project.scons("stage=spec", f"cache={blocker}/sub", check=False)
    assert run.returncode != 0 and f"cache={blocker}/sub" in run.stderr
    assert not (project.root / "build" / K).exists()


def test_tampered_result_is_named_not_trusted_and_redone(built):
    result = built.root / "build" / K / "gpu" / GPU / "validate.json"
    data = json.loads(result.read_text())
    data["message"] = "all variants pass (edited by hand)"
    result.write_text(json.dumps(data))
    check = built.scons("check", f"gpu={GPU}", check=False)
    assert check.returncode == 1 and "modified after its gate wrote it" in check.stderr
    assert json.loads(result.read_text())["message"].endswith("(edited by hand)")   # changed nothing
    run = built.scons("stage=validate")
    assert f"validate {K} {GPU}" in run.actions
    assert "modified after its gate wrote it" in run.stdout
    assert stale_set(built, "stage=validate") == set()


def test_status_json_is_json_alone_with_q_and_after_one_scons_line_without(built):
    """The tool turns SCons's progress off for --json; the line SCons prints before it reads
    the SConstruct is only kept off by -Q (a project has no site_init.py of ours)."""
    import subprocess, sys, os
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(built.root / "site_scons")] + [
        p for p in [os.environ.get("PYTHONPATH")] if p])}
    base = [sys.executable, "-m", "SCons", "status", "--json", "executor=fake_gpu:FakeGpuExecutor"]
    from conftest import FAKES
    env["PYTHONPATH"] = os.pathsep.join([str(FAKES), env["PYTHONPATH"]])
    # a tampered result makes planning print a note: it goes to stderr
    result = built.root / "build" / K / "gpu" / GPU / "validate.json"
    result.write_text(result.read_text().replace('"verdict"', '"verdict" '))
    for extra in ([], ["-Q"]):
        proc = subprocess.run(base + extra, cwd=built.root, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        if not extra:
            first, out = out.split("\n", 1)
            assert first == "scons: Reading SConscript files ..."
        json.loads(out)                   # nothing else on stdout
        assert "modified after its gate wrote it" in proc.stderr
    # a reader that went away: quiet, no traceback, the command's own exit status
    for args in (["status"], ["status", "--json"], ["check", f"gpu={GPU}"]):
        proc = subprocess.Popen([sys.executable, "-m", "SCons", *args,
                                 "executor=fake_gpu:FakeGpuExecutor"], cwd=built.root, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()
        err = proc.stderr.read().decode()
        rc = proc.wait()
        assert "Traceback" not in err and "BrokenPipe" not in err, err
        assert rc == (1 if args[0] == "check" else 0), err


def test_same_size_mtime_kept_result_edit_is_not_trusted(built):
    """A failed verdict edited to pass by hand, size and mtime put back: status, check and
    the build see it."""
    built.edit(SPEC, "rel_max: 3.0e-2", "rel_max: 2.0e-2")
    built.scons("stage=validate", env={"FAKE_GPU_VERDICT": json.dumps({"validate": "fail"})}, check=False)
    result = built.root / "build" / K / "gpu" / GPU / "validate.json"
    text = result.read_text()
    assert '"verdict": "fail"' in text
    st = os.stat(result)
    result.write_text(text.replace('"verdict": "fail"', '"verdict": "pass"'))
    os.utime(result, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(result).st_size == st.st_size
    status = built.scons("status", "--json")
    row = {r["label"]: r for r in json.loads(status.stdout)["nodes"]}[f"validate {K} {GPU}"]
    assert row["state"] == "stale", row
    assert any("modified after its gate wrote it" in r for r in row["reasons"]), row
    check = built.scons("check", f"gpu={GPU}", check=False)
    assert check.returncode == 1 and "modified after its gate wrote it" in check.stderr
    run = built.scons("stage=validate")
    assert f"validate {K} {GPU}" in run.actions
    assert json.loads(result.read_text())["verdict"] == "pass"


def test_old_timestamp_is_not_trusted_by_the_build(built):
    """SCons's max_drift shortcut trusts a recorded signature for a file whose mtime is more
    than two days old and unchanged; a same-size edit with that old mtime put back must
    still rebuild (and -n and status say so)."""
    body = f"kernels/{K}/{K}.cuh.j2"
    old = time.time() - 5 * 24 * 3600
    os.utime(built.path(body), (old, old))
    assert built.scons("stage=review").actions == []       # SCons records the old timestamp
    kept_mtime_edit(body, "// One task = RPT consecutive rows", "// One task = RPT consecutive ROWS")(built)
    predicted = dry_run_set(built, "stage=review")
    assert f"compile {K} sm_90a" in predicted
    assert predicted == stale_set(built, "stage=review")
    executed = set(built.scons("stage=review").actions)
    assert executed == predicted
    assert "One task = RPT consecutive ROWS" in (built.root / "build" / K / "gen" / f"{K}.cuh").read_text()
    assert stale_set(built, "stage=review") == set()


def test_shared_cache_files_follow_the_umask_and_another_user_reads_them(built, tmp_path):
    """SCons's CacheDir copies a target's mode: results written mode 0600 (mkstemp) were
    unreadable by the cache's other users. They follow the umask, as open() would."""
    import subprocess, sys, tempfile
    share = Path(tempfile.mkdtemp(prefix="mpk-shared-cache-"))
    try:
        share.chmod(0o755)
        cache = share / "cache"
        run = built.scons("stage=review", f"cache={cache}", "--cache-force",
                          env={"PYTHONDONTWRITEBYTECODE": "1"})
        files = [p for p in cache.rglob("*") if p.is_file() and p.name != "config"]
        assert files, run.stdout
        result = built.root / "build" / K / "gpu" / GPU / "validate.json"
        umask = os.umask(0o022)
        os.umask(umask)
        assert stat.S_IMODE(os.stat(result).st_mode) == 0o666 & ~umask
        for p in files:
            assert stat.S_IMODE(p.stat().st_mode) & 0o044 == 0o044 & ~umask, (p, oct(p.stat().st_mode))
        if os.geteuid() != 0:
            pytest.skip("reading as another user needs root (to switch to uid 65534)")
        reader = ("import os, sys\nos.setgid(65534); os.setuid(65534)\n"
                  "for p in sys.argv[1:]:\n    open(p, 'rb').read()\nprint('read', len(sys.argv) - 1)\n")
        proc = subprocess.run([sys.executable, "-c", reader, *map(str, files)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"read {len(files)}"
    finally:
        import shutil
        shutil.rmtree(share, ignore_errors=True)


def test_status_is_compact_by_default_and_details_lists_every_reason(built):
    """Without this profile's GPU every GPU node is pending: the default says how many in
    one line (the table has them per kernel); --details lists each with its reasons."""
    short = built.scons("status", fake_gpu=False).stdout
    full = built.scons("status", "--details", fake_gpu=False).stdout
    assert f"validate {K} " not in short and "pending (pending: no GPU of this profile here)" in short
    assert "scons status --details" in short
    assert f"validate {K} " in full and "no GPU of this profile here" in full
    assert len(short.splitlines()) < len(full.splitlines())
