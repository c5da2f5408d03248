"""One nvcc compile run as nvcc's own steps (its --dryrun), the device chain and the host
chain side by side, the host object kept while the host side does not change. The runtime
gate's megakernel compile uses it: a body edit then costs the device chain alone. Standard
library only."""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path


FATBIN_SHIM = """// written by mpkbuild's split build: the device code is linked in from its own object
#include "fatbinary_section.h"
#define __CUDAFATBINSECTION ".nvFatBinSegment"
#define __CUDAFATBINDATASECTION ".nv_fatbin"
extern "C" const __fatBinC_Wrapper_t mpkb_fat_device_text;
#define __fatDeviceText mpkb_fat_device_text
"""


def split_compile(cmd: list[str], work: Path, cache: Path | None = None) -> tuple[bool, str]:
    """nvcc's own steps (from its --dryrun) for one megakernel, with the device chain
    (preprocess, cicc, ptxas, fatbinary) and the host chain (preprocess, cudafe++, the host
    compiler) run side by side instead of one after the other, then nvcc's link steps.

    Two changes make them independent, and neither touches the device code: the module id
    both chains read is written first (a fixed one per source, where nvcc makes it in
    cudafe++), and the host object takes the device code's wrapper by name
    (FATBIN_SHIM, in place of the fatbin.c nvcc includes in its stub) from an object of
    its own made from fatbinary's output. The cubin is the one plain nvcc makes (the test
    compares their SASS). (ok, every step's command and output)."""
    cache = cache or work.with_name(work.name + "-host")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    dry = subprocess.run(cmd + ["--dryrun", "--keep", f"--keep-dir={work}"], capture_output=True, text=True)
    if dry.returncode != 0:
        return False, dry.stdout + dry.stderr
    env, steps = dict(os.environ), []
    for line in dry.stderr.splitlines():
        if not line.startswith("#$ "):
            continue
        body = line[3:]
        if re.match(r"[A-Za-z_][A-Za-z0-9_]*=", body):    # nvcc's own variables (expanded)
            name, _, value = body.partition("=")
            env[name] = value.replace('"', "").strip()
        else:
            steps.append(body)
    why = ""
    try:
        chains = _chains(cmd, steps)
    except (StopIteration, ValueError, AttributeError, IndexError) as exc:
        chains, why = None, f": {type(exc).__name__}: {exc}"
    if chains is None:
        # another nvcc's steps than the ones this knows: one plain nvcc, and the log says so
        proc = subprocess.run(cmd, capture_output=True, text=True)
        note = f"(not split: this nvcc's --dryrun has other steps{why})\n"
        return proc.returncode == 0, note + proc.stdout + proc.stderr
    device, device_back, host, host_back, link, device_c = chains
    log = {}

    def run(name, chain):
        script = "\n".join(["set -e", *chain])
        t0 = time.perf_counter()
        p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=work, env=env)
        log[name] = (f"[{name}: {time.perf_counter() - t0:.1f} s]\n" + "\n".join(f"$ {st}" for st in chain)
                     + "\n" + p.stdout + p.stderr)
        return p.returncode == 0

    # the host compile's stub includes <name>.fatbin.c: the shim, which names the wrapper
    Path(device_c[:-len(".device.fatbin.c")] + ".fatbin.c").write_text(FATBIN_SHIM)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        # the fronts (cicc writes the host stub the host compile includes), then the backs
        ok = all(list(pool.map(run, ("device", "host"), (device, host))))
        # a front that failed left no host side to look up: its log is the answer
        hit, host_back = _host_object(host_back, work, cache) if ok else (None, host_back)
        ok = ok and all(list(pool.map(run, ("device back", "host back"), (device_back, host_back))))
        if hit:
            log["host back"] = f"(the host object of an identical host side: {hit})"
    wrapper = "static const __fatBinC_Wrapper_t __fatDeviceText"
    text = Path(device_c).read_text() if ok else ""
    if ok and wrapper not in text:
        log["link"] = f"fatbinary's {device_c} has no `{wrapper}` to link by name"
        ok = False
    if ok:
        Path(device_c).write_text(text.replace(wrapper, "extern const __fatBinC_Wrapper_t mpkb_fat_device_text"))
        obj = device_c[:-2] + ".o"
        link[-1] += f" {shlex.quote(obj)}"
        ok = run("link", [f'gcc -c -x c++ -fPIC $INCLUDES {shlex.quote(device_c)} -o {shlex.quote(obj)}',
                          *link])
    return ok, "\n".join(log[k] for k in ("device", "host", "device back", "host back", "link") if k in log)


def _chains(cmd: list[str], steps: list[str]):
    """(device front, device back, host front, host back, link, the device fatbin.c) from
    nvcc's steps, the module id file written; raises where the steps are not nvcc 12-13's."""
    cudafe = next(shlex.split(st) for st in steps if shlex.split(st)[0] == "cudafe++")
    module_id = cudafe[cudafe.index("--module_id_file_name") + 1]
    # nvcc's own form (_<hash>_<length>_<file>_<hash>), fixed for this source and these flags
    digest = hashlib.sha256(" ".join(cmd[:-2]).encode()).hexdigest()
    base = Path(cmd[1]).name.replace(".", "_")
    Path(module_id).write_text(f"_{digest[:8]}_{len(base)}_{base}_{digest[8:16]}")
    device, device_back, host, host_back, link, device_c = [], [], [], [], [], None
    for st in steps:
        tool = Path(shlex.split(st)[0]).name
        if tool == "rm":
            continue
        if tool == "cudafe++":
            host.append(st.replace("--gen_module_id_file ", ""))
        elif tool == "cicc" or (tool == "gcc" and " -E " in st and "-D__CUDA_ARCH__=" in st):
            device.append(st)
        elif tool == "ptxas":
            device_back.append(st)
        elif tool == "fatbinary" and " -link " not in st:
            m = re.search(r'--embedded-fatbin="?([^" ]+)"?', st)
            device_c = m.group(1)[:-len(".fatbin.c")] + ".device.fatbin.c"
            device_back.append(st.replace(m.group(1), device_c))
        elif not link and tool == "gcc" and " -E " in st:
            host.append(st)
        elif not link and tool == "gcc" and ".cudafe1.cpp" in st:
            host_back.append(st)
        else:
            link.append(st)
    if not (device and device_back and host and len(host_back) == 1 and link and device_c):
        raise ValueError(f"{len(device)}+{len(device_back)} device, {len(host)}+{len(host_back)} "
                         f"host and {len(link)} link steps")
    return device, device_back, host, host_back, link, device_c


def _host_object(host_back: list[str], work: Path, cache: Path) -> tuple[str | None, list[str]]:
    """(the cached object used, the commands still to run) for the host compile. Its input
    is the host side cudafe++ and cicc leave (the .cudafe1.cpp and its stub); where that
    is what the last compile had, line markers aside (a body edit moves them, and without
    -g they change nothing but __LINE__, which NDEBUG leaves unused), the object it made is
    copied in. Else the compile runs and its object is kept for next time."""
    (st,) = host_back
    argv = shlex.split(st)
    src, obj = next(a for a in argv if a.endswith(".cudafe1.cpp")), argv[argv.index("-o") + 1]
    h = hashlib.sha256(st.replace(str(work), "<work>").encode())
    for path in (Path(src), Path(src[:-len(".cpp")] + ".stub.c")):
        text = path.read_bytes()
        h.update(re.sub(rb"(?m)^#(line)? \d+( .*)?$", b"", text))
    key = cache / f"{h.hexdigest()[:24]}.o"
    if key.is_file():
        shutil.copyfile(key, obj)
        return key.name, []
    if cache.exists():
        shutil.rmtree(cache)            # one host object kept: the last one
    cache.mkdir(parents=True)
    return None, [st, f"cp {shlex.quote(obj)} {shlex.quote(str(key))}"]


def cubin_functions(cubin: Path) -> dict[str, bytes]:
    """The machine code of each function of a cubin (ELF64): its .text.<name> sections, by
    name (SASS instructions are 16 bytes each on sm_90)."""
    import struct
    b = Path(cubin).read_bytes()
    shoff = struct.unpack_from("<Q", b, 0x28)[0]
    size, count, names_at = struct.unpack_from("<HHH", b, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * size) for i in range(count)]
    names = heads[names_at][4]

    def name(off: int) -> str:
        return b[names + off:b.index(b"\0", names + off)].decode()
    return {name(h[0])[len(".text."):]: b[h[4]:h[4] + h[5]] for h in heads if name(h[0]).startswith(".text.")}

