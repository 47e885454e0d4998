"""Static checks of deploy/Dockerfile (no container runtime needed).

The image is not built where the tests run, so this reads the Dockerfile and
asserts what a build would rely on and what the deployment needs: a multi-stage
build whose runtime stage holds no toolchain; pinned base images on one Debian
release; every workspace crate in the build context and not excluded by
deploy/Dockerfile.dockerignore; a numeric non-root USER; files the process cannot
write; a HEALTHCHECK on /healthz and /readyz; no ADD of URLs, no piped installers,
no secrets in ENV or ARG; an exec-form ENTRYPOINT; and the ports, paths and uid
the Helm chart's values assume. Prints one line per check; exits 1 on any failure.

    python deploy/dockerfile_check.py [DOCKERFILE]   # default deploy/Dockerfile
"""
from __future__ import annotations

import json
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
IGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"
VALUES = ROOT / "deploy" / "helm" / "inference-mesh" / "values.yaml"


@dataclass
class Instr:
    line: int
    op: str
    args: str


@dataclass
class Stage:
    base: str
    name: str | None
    instrs: list[Instr] = field(default_factory=list)

    def ops(self, op: str) -> list[Instr]:
        return [i for i in self.instrs if i.op == op]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Parser directives, and the stages with their instructions (continuation
    lines joined, comments dropped)."""
    directives = {}
    lines = text.splitlines()
    for raw in lines:
        m = re.match(r"#\s*(\w+)\s*=\s*(\S+)\s*$", raw)
        if not m:
            break
        directives[m.group(1).lower()] = m.group(2)
    instrs, buf, start = [], "", 0
    for n, raw in enumerate(lines, 1):
        s = raw.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue  # a comment inside a continued instruction
        if not buf:
            start = n
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        buf += s
        op, _, args = buf.partition(" ")
        instrs.append(Instr(start, op.upper(), args.strip()))
        buf = ""
    stages: list[Stage] = []
    for i in instrs:
        if i.op == "FROM":
            parts = [p for p in i.args.split() if not p.startswith("--")]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif stages:
            stages[-1].instrs.append(i)
    return directives, stages


def flags(args: str) -> tuple[dict[str, str], list[str]]:
    """--flag=value options and the remaining words of COPY/ADD/RUN arguments."""
    words = shlex.split(args)
    opts, rest = {}, []
    for w in words:
        if w.startswith("--") and not rest:
            k, _, v = w[2:].partition("=")
            opts[k] = v
        else:
            rest.append(w)
    return opts, rest


def env_of(stage: Stage) -> dict[str, str]:
    env = {}
    for i in stage.ops("ENV"):
        for w in shlex.split(i.args):
            k, sep, v = w.partition("=")
            if sep:
                env[k] = v
    return env


def ignore_rules() -> list[tuple[bool, re.Pattern]]:
    """(exclude?, regex) per line of the .dockerignore, in order (the last match
    decides, as in Docker)."""
    rules = []
    for raw in IGNORE.read_text().splitlines():
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        neg = s.startswith("!")
        pat = s[1:] if neg else s
        pat = pat.strip("/")
        rx = ""
        i = 0
        while i < len(pat):
            if pat.startswith("**/", i):
                rx += "(?:.*/)?"
                i += 3
            elif pat.startswith("**", i):
                rx += ".*"
                i += 2
            elif pat[i] == "*":
                rx += "[^/]*"
                i += 1
            elif pat[i] == "?":
                rx += "[^/]"
                i += 1
            else:
                rx += re.escape(pat[i])
                i += 1
        # A pattern that names a directory covers what is under it.
        rules.append((not neg, re.compile(f"^{rx}(?:/.*)?$")))
    return rules


def excluded(path: str, rules) -> bool:
    out = False
    for exclude, rx in rules:
        if rx.match(path):
            out = exclude
    return out


def context_files(src: str) -> list[str]:
    p = ROOT / src
    if p.is_file():
        return [src]
    return [str(f.relative_to(ROOT)) for f in p.rglob("*") if f.is_file()
            and "target" not in f.relative_to(ROOT).parts]


def main() -> int:
    global DOCKERFILE
    if len(sys.argv) > 1:
        DOCKERFILE = Path(sys.argv[1]).resolve()
    failures: list[str] = []

    def check(what: str, ok: bool, detail: str = ""):
        print(f"   {'ok    ' if ok else 'FAILED'} {what}" + (f": {detail}" if detail and not ok else ""))
        if not ok:
            failures.append(what)

    directives, stages = parse(DOCKERFILE.read_text())
    values = yaml.safe_load(VALUES.read_text())
    check("a syntax directive (BuildKit: RUN --mount, the .dockerignore next to the Dockerfile)",
          directives.get("syntax", "").startswith("docker/dockerfile:1"), str(directives))
    check("multi-stage: at least two stages", len(stages) >= 2, f"{len(stages)} stage(s)")
    if len(stages) < 2:
        return 1
    build = next((s for s in stages if s.name == "build"), None)
    final = stages[-1]
    check("a stage named build", build is not None)
    if build is None:
        return 1
    for s in stages:
        pinned = (("@sha256:" in s.base) or (":" in s.base.split("/")[-1])) and not s.base.endswith(":latest")
        check(f"base image {s.base} is pinned (a tag or digest, not latest)", pinned)
    codename = lambda base: next((c for c in ("bookworm", "trixie", "bullseye") if c in base), None)
    check("build and runtime stages share one Debian release (the binary's glibc)",
          codename(build.base) is not None and codename(build.base) == codename(final.base),
          f"{build.base} vs {final.base}")
    check("the runtime stage has no Rust toolchain", not final.base.startswith("rust"), final.base)

    # The build: every workspace member is in the context and copied.
    members = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["members"]
    copied = set()
    for i in build.ops("COPY"):
        _, words = flags(i.args)
        copied.update(w.rstrip("/") for w in words[:-1])
    missing = [m for m in members if m not in copied]
    check("the build stage copies every workspace member and Cargo.lock",
          not missing and {"Cargo.toml", "Cargo.lock"} <= copied, f"missing {missing}")
    runs = " ".join(i.args for i in build.ops("RUN"))
    check("cargo build --release --locked of the mesh binary",
          re.search(r"cargo build --release --locked -p mesh --bin mesh", runs) is not None, runs)

    rules = ignore_rules()
    sources = []
    for s in stages:
        for i in s.ops("COPY"):
            opts, words = flags(i.args)
            if "from" not in opts:
                sources += words[:-1]
    unreadable = []
    for src in sources:
        files = context_files(src)
        if not files:
            unreadable.append(f"{src} (not in the repository)")
        for f in files:
            if excluded(f, rules):
                unreadable.append(f"{f} (excluded by the .dockerignore)")
    check("every COPY source is in the repository and in the build context", not unreadable,
          ", ".join(unreadable[:5]))
    check("the .dockerignore keeps target/ out of the context",
          excluded("target/debug/mesh", rules) and excluded("router/target/x", rules))

    # The runtime stage.
    check("the runtime stage copies the binary from the build stage",
          any(flags(i.args)[0].get("from") == "build" for i in final.ops("COPY")))
    users = final.ops("USER")
    uid = gid = None
    if users:
        m = re.fullmatch(r"(\d+)(?::(\d+))?", users[-1].args)
        if m:
            uid, gid = int(m.group(1)), int(m.group(2) or -1)
    check("USER is a numeric non-root uid:gid (runAsNonRoot can verify it)",
          uid is not None and uid != 0 and gid not in (None, 0), users[-1].args if users else "no USER")
    runtime_ops = [i.op for i in final.instrs]
    last_user = max((n for n, op in enumerate(runtime_ops) if op == "USER"), default=10**9)
    check("USER comes before ENTRYPOINT and CMD",
          all(n > last_user for n, op in enumerate(runtime_ops) if op in ("ENTRYPOINT", "CMD")))
    check("no RUN after USER (everything is installed as root, then dropped)",
          all(n < last_user for n, op in enumerate(runtime_ops) if op == "RUN"))
    owned = [i for i in final.ops("COPY") if flags(i.args)[0].get("chown") not in ("0:0", "root:root")]
    check("files copied into the runtime stage are owned by root (not writable by the mesh user)",
          not owned, ", ".join(i.args for i in owned))
    check("the binary is installed read-only and executable (0555)",
          re.search(r"install\b[^&]*-m 0555\b", runs) is not None)
    writable = re.findall(r"chmod\s+[0-7]*[2367][0-7]*\s|chmod\s+[a-z]*\+w", " ".join(i.args for i in final.ops("RUN")))
    check("no chmod makes a path writable", not writable, str(writable))
    workdirs = [i.args for i in final.ops("WORKDIR")]
    check("the working directory is /var/lib/mesh (the chart's volume), not /",
          workdirs[-1:] == ["/var/lib/mesh"], str(workdirs))

    hc = final.ops("HEALTHCHECK")
    check("a HEALTHCHECK", len(hc) == 1)
    if hc:
        check("the HEALTHCHECK asks /healthz and /readyz", "/healthz" in hc[0].args and "/readyz" in hc[0].args, hc[0].args)
        check("the HEALTHCHECK fails on an HTTP error (curl -f)", "curl -fsS" in hc[0].args, hc[0].args)

    adds = [i for s in stages for i in s.ops("ADD")]
    check("no ADD (COPY only; never a URL)", not adds, ", ".join(i.args for i in adds))
    all_runs = " ".join(i.args for s in stages for i in s.ops("RUN"))
    check("no installer piped into a shell", re.search(r"(curl|wget)[^|;&]*\|\s*(ba)?sh", all_runs) is None)
    secretish = [k for s in stages for k in list(env_of(s)) + [i.args.split("=")[0] for i in s.ops("ARG")]
                 if re.search(r"TOKEN|PASSWORD|SECRET|PRIVATE|_KEY", k, re.I)]
    check("no secrets in ENV or ARG", not secretish, str(secretish))
    check("apt lists removed in the same RUN as the install",
          all("rm -rf /var/lib/apt/lists" in i.args for i in final.ops("RUN") if "apt-get install" in i.args))
    check("apt-get install --no-install-recommends",
          all("--no-install-recommends" in i.args for s in stages for i in s.ops("RUN") if "apt-get install" in i.args))

    ep = final.ops("ENTRYPOINT")
    exec_form = False
    if ep:
        try:
            exec_form = isinstance(json.loads(ep[-1].args), list)
        except json.JSONDecodeError:
            pass
    check("ENTRYPOINT in exec form (the mesh is PID 1 and gets SIGTERM)", exec_form, ep[-1].args if ep else "none")
    check("STOPSIGNAL SIGTERM", [i.args for i in final.ops("STOPSIGNAL")] == ["SIGTERM"])

    # What the chart assumes of the image.
    env = env_of(final)
    exposed = {int(p.split("/")[0]) for i in final.ops("EXPOSE") for p in i.args.split()}
    ports = values["ports"]
    check("ENV binds every interface (MESH_HOST=0.0.0.0)", env.get("MESH_HOST") == "0.0.0.0", str(env))
    check("EXPOSE and MESH_*_PORT are the chart's ports",
          exposed == {ports["grpc"], ports["http"]} and env.get("MESH_GRPC_PORT") == str(ports["grpc"])
          and env.get("MESH_HTTP_PORT") == str(ports["http"]), f"{exposed} {env}")
    dests = {flags(i.args)[1][-1]: flags(i.args)[1][:-1] for i in final.ops("COPY")}
    check("the example model repository is at MESH_MODELS (/models, the chart's default)",
          env.get("MESH_MODELS") == "/models" and dests.get("/models") == ["examples/models"], str(dests))
    check("the example views are at /etc/mesh/views.toml (the chart's default views)",
          dests.get("/etc/mesh/views.toml") == ["examples/features/views.toml"])
    sc = values["podSecurityContext"]
    check("the chart runs as the image's USER", (sc.get("runAsUser"), sc.get("runAsGroup")) == (uid, gid),
          f"chart {sc.get('runAsUser')}:{sc.get('runAsGroup')}, image {uid}:{gid}")
    check("the chart's root filesystem is read-only", values["securityContext"].get("readOnlyRootFilesystem") is True)

    print(f"   {DOCKERFILE}: {len(stages)} stages, "
          f"{'all checks passed' if not failures else f'{len(failures)} failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
