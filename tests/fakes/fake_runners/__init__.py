"""Stand-in gate runners for tests: `MPK_RUNNER_PACKAGE=fake_runners` (tests/fakes on PYTHONPATH).

Each of validate/perf/bandwidth reads the job file like a real runner, checks that every
file the job names exists, and reports what it found: sha256 of every file in the bundle
folder (when the job's root is an unpacked bundle), the list of those files, the GPU env
it was given and which mpkbuild it imported. It never touches a GPU or torch.

$FAKE_RUNNER_CONTROL names a JSON file `{"<gate>": "pass"|"fail"|"hang"|"crash", ...}` read
at start (missing file or gate: pass), so a test can change behaviour on a running ssh
server; $FAKE_RUNNER_PIDS names a file each runner appends `pid gate kernel` to.
"""
