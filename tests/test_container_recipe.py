"""deploy/Containerfile and its entrypoint: the recipe's structure (stages, no torch in the
serving stage, non-root user, port, healthcheck), the entrypoint's dispatch (run with a stand-in
`cosyvino`), and, opt-in (COSYVINO_TEST_CONTAINER=1 with podman + buildah), the image built and
answering speech (deploy/smoke-test.sh, several minutes)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def _instructions(path: pathlib.Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile: comments dropped, continuations joined."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, "dangling line continuation"
    return out


def _stages() -> dict[str, list[tuple[str, str]]]:
    stages, current = {}, None
    for ins, args in _instructions(DEPLOY / "Containerfile"):
        if ins == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", args, re.IGNORECASE)
            assert m, f"unnamed stage: FROM {args}"
            current = m.group(2)
            stages[current] = [(ins, args)]
        elif current is None:
            assert ins == "ARG", f"{ins} before the first FROM"
        else:
            stages[current].append((ins, args))
    return stages


def _args(stage, ins) -> list[str]:
    return [a for i, a in stage if i == ins]


def test_two_stages_on_the_standard_base():
    head = [a for i, a in _instructions(DEPLOY / "Containerfile")[:1] if i == "ARG"]
    assert head == ["BASE_IMAGE=docker.io/library/python:3.11-slim"]
    stages = _stages()
    assert list(stages) == ["build", "serve"]
    for stage in stages.values():
        assert stage[0][1].split()[0] == "${BASE_IMAGE}"


def test_build_stage_converts_with_torch():
    build = " ".join(_args(_stages()["build"], "RUN"))
    assert '"torch==2.13.0"' in build and "[torch,openvino,nncf]" in build
    assert "cosyvino convert --model-dir /model" in build
    assert "cosyvino make-model" in build and "cosyvino quantize" in build
    assert "pip wheel" in build


def test_serving_stage_has_no_torch_and_runs_as_non_root():
    serve = _stages()["serve"]
    runs = " ".join(_args(serve, "RUN"))
    assert "[openvino,server]" in runs
    assert "torch" not in runs.replace('import torch', '').replace("torch must not", "")
    assert 'python -c "import torch"' in runs   # the build fails if torch got in
    # only the wheel and the converted dir come from the build stage (no .pt checkpoint)
    froms = [a for a in _args(serve, "COPY") if a.startswith("--from=")]
    assert sorted(a.split()[1] for a in froms) == ["/dist", "/model/served"]
    (user,) = _args(serve, "USER")
    assert user.split(":")[0] not in ("0", "root")
    assert "useradd" in runs and f"--uid {user.split(':')[0]}" in runs
    assert _args(serve, "EXPOSE") == ["8000"]
    (health,) = _args(serve, "HEALTHCHECK")
    assert "/health" in health and health.split("CMD", 1)[1].strip().startswith("[")
    assert _args(serve, "ENTRYPOINT") == ['["cosyvino-entrypoint"]']
    env = " ".join(_args(serve, "ENV"))
    for var in ("COSYVINO_MODEL_DIR=/models/cosyvino", "COSYVINO_VOICES_DIR=",
                "XDG_CACHE_HOME=", "COSYVINO_PORT=8000"):
        assert var in env


def test_build_context_keeps_what_the_recipe_copies():
    ignore = (DEPLOY / "Containerfile.dockerignore").read_text().splitlines()
    kept = {line[1:].rstrip("/*") for line in ignore if line.startswith("!")}
    for stage in _stages().values():
        for args in _args(stage, "COPY"):
            if args.startswith("--from="):
                continue
            *sources, _dest = args.split()
            for src in sources:
                src = src.rstrip("/").rstrip("*")
                assert any(src == k or src.startswith(k + "/") for k in kept), src
                if not src.startswith("LICENSE"):
                    assert (ROOT / src).exists(), src
    assert (DEPLOY / "model" / "README.md").is_file()


@pytest.fixture
def fake_cosyvino(tmp_path):
    """A stand-in `cosyvino` on PATH that logs its arguments and COSYVINO_PLAN."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls"
    fake = bindir / "cosyvino"
    fake.write_text("#!/bin/sh\n"
                    f'echo "$* | plan=${{COSYVINO_PLAN:-}}" >> "{log}"\n'
                    'case "$1" in plan) echo "(plan table)";; esac\n')
    fake.chmod(0o755)
    return bindir, log


def _entry(fake, *args, env=None, cwd):
    bindir, log = fake
    e = {"PATH": f"{bindir}:/usr/bin:/bin", "COSYVINO_MODEL_DIR": "/m"}
    e.update(env or {})
    proc = subprocess.run(["sh", str(DEPLOY / "entrypoint.sh"), *args], env=e, cwd=cwd,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return calls, proc


def test_entrypoint_plans_in_the_container_then_serves(fake_cosyvino, tmp_path):
    calls, proc = _entry(fake_cosyvino, cwd=tmp_path)
    assert calls == ["plan --model-dir /m --out /tmp/cosyvino-plan.toml | plan=",
                     "serve --host 0.0.0.0 | plan=/tmp/cosyvino-plan.toml"]
    assert "(plan table)" in proc.stderr and proc.stdout == ""   # the table goes to the log
    calls, _ = _entry(fake_cosyvino, "serve", "--port", "9000", cwd=tmp_path,
                      env={"COSYVINO_PLAN": "/etc/cosyvino/plan.toml",
                           "COSYVINO_HOST": "::"})
    assert calls == ["serve --host :: --port 9000 | plan=/etc/cosyvino/plan.toml"]
    (tmp_path / "plan.toml").write_text("")
    calls, _ = _entry(fake_cosyvino, "--log-format", "json", cwd=tmp_path)
    assert calls == ["serve --host 0.0.0.0 --log-format json | plan="]


def test_entrypoint_runs_other_commands(fake_cosyvino, tmp_path):
    calls, proc = _entry(fake_cosyvino, "plan", "--no-write", "--emit", "k8s", cwd=tmp_path)
    assert calls == ["plan --no-write --emit k8s | plan="]
    assert "(plan table)" in proc.stdout


def test_shell_scripts_parse():
    for script in ("entrypoint.sh", "build-base.sh", "smoke-test.sh"):
        path = DEPLOY / script
        assert os.access(path, os.X_OK), f"{script} is not executable"
        subprocess.run(["sh", "-n", str(path)], check=True, timeout=30)


@pytest.mark.skipif(os.environ.get("COSYVINO_TEST_CONTAINER") != "1"
                    or not (shutil.which("podman") and shutil.which("buildah")),
                    reason="opt-in: COSYVINO_TEST_CONTAINER=1 with podman and buildah")
def test_image_builds_and_serves_speech():
    proc = subprocess.run([str(DEPLOY / "smoke-test.sh")], capture_output=True, text=True,
                          timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "smoke test passed" in proc.stdout
