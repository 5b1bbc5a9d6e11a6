"""docker-compose.yml is valid (checked by `docker-compose config`, no engine needed) and wires the service
as intended: one-shot migration first, credentials only where they are needed, one worker per GPU."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> dict:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (Debian: apt-get install docker-compose); "
                    "docker-compose.yml was not validated")
    work = tmp_path_factory.mktemp("compose")
    shutil.copy(ROOT / "docker-compose.yml", work / "docker-compose.yml")
    shutil.copy(ROOT / ".env.example", work / ".env.example")
    shutil.copytree(ROOT / "docker", work / "docker")  # the GPU worker's seccomp profile (read by `config`)
    # The README's check, as written: no .env beside it.
    out = subprocess.run([binary, "--env-file", ".env.example", "config"], cwd=work, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def test_services_present(compose):
    assert set(compose["services"]) == {"postgres", "redis", "migrate", "web", "publish-worker", "gpu-worker-0",
                                        "gpu-worker-1"}


def test_migration_runs_once_before_the_app(compose):
    s = compose["services"]
    assert s["migrate"]["command"] == ["tokengate", "db", "upgrade"] and s["migrate"]["restart"] == "no"
    for name in ("web", "publish-worker"):
        assert s[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_secrets_only_on_the_bot_side(compose):
    s = compose["services"]
    for name in ("web", "publish-worker"):
        assert [x["source"] if isinstance(x, dict) else x for x in s[name]["secrets"]] == ["github_app_key"]
    for name in ("gpu-worker-0", "gpu-worker-1"):
        assert "secrets" not in s[name] and not s[name].get("env_file")
        env = s[name]["environment"]
        # Its own result key and broker user only: no GitHub secret, no database, no other worker's key.
        assert not any("SECRET" in k or "KEY" in k or "DATABASE" in k for k in env if k != "TOKENGATE_WORKER_KEY")
        assert env["TOKENGATE_BROKER_URL"].startswith(f"redis://gpu{name[-1]}:")
        assert env["TOKENGATE_WORKER_ID"] == f"gpu{name[-1]}"
    lines = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if not line.startswith("#")]
    assert not any(word in line for line in lines for word in ("SECRET", "PRIVATE_KEY", ".env", ".pem"))


def test_one_worker_per_gpu(compose):
    s = compose["services"]
    ids = []
    for name in ("gpu-worker-0", "gpu-worker-1"):
        (device,) = s[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        ids += device["device_ids"]
        assert s[name]["environment"]["TOKENGATE_HOST_GPU"] == device["device_ids"][0]
        assert s[name]["environment"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert "gpu" in s[name]["command"] and "--concurrency" in s[name]["command"]
    assert sorted(ids) == ["0", "1"]


def test_redis_requires_a_password_and_its_users_follow_the_acl_rules(compose):
    """redis-server's `--user` directives are bot/queue/acl.py's rules (the ones tested on a real Redis)."""
    from bot.queue import acl
    from bot.testing.native_stack import parse_env_file
    env = parse_env_file((ROOT / ".env.example").read_text())
    command = compose["services"]["redis"]["command"]
    users, current = {}, None
    for token in command[1:]:
        if token == "--user":
            current = []
            continue
        if current is not None:
            if token.startswith("--"):
                current = None
                continue
            if not current:
                users[token] = current
            current.append(token)
    assert users["default"] == ["default", "off"]
    assert users["web"][1:] == acl.web_rules(env["REDIS_WEB_PASSWORD"])
    for i in ("0", "1"):
        assert users[f"gpu{i}"][1:] == acl.gpu_rules(env[f"REDIS_GPU{i}_PASSWORD"])
    for name in ("web", "publish-worker", "migrate"):
        assert compose["services"][name]["environment"]["TOKENGATE_BROKER_URL"].startswith("redis://web:")


def test_gpu_workers_can_build_the_sandbox_without_privilege(compose):
    """User namespaces and mounts for bubblewrap, a private cgroup namespace, no privilege, no capabilities."""
    import json

    s = compose["services"]
    for name in ("gpu-worker-0", "gpu-worker-1"):
        w = s[name]
        assert not w.get("privileged") and w["cap_drop"] == ["ALL"] and not w.get("cap_add")
        opts = [o.replace(":", "=", 1) for o in w["security_opt"]]
        assert "seccomp=./docker/gpu-worker-seccomp.json" in opts
        assert {"apparmor=unconfined", "systempaths=unconfined", "no-new-privileges=true"} <= set(opts)
        assert w.get("cgroup", "private") == "private" and not w.get("cgroup_parent")
        assert not any(str(v).split(":")[0] in ("/sys/fs/cgroup", "/sys", "/var/run/docker.sock", "/run")
                       for v in w.get("volumes", []))
        assert w.get("user") in (None, "tokengate", "10001")  # the image's unprivileged user
    for name in ("web", "publish-worker", "migrate"):  # only the GPU side needs any of it
        assert "security_opt" not in s[name] and not s[name].get("privileged")
    profile = json.loads((ROOT / "docker" / "gpu-worker-seccomp.json").read_text())
    refused = {n for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ERRNO" for n in rule["names"]}
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert not refused & {"clone", "clone3", "unshare", "setns", "mount", "umount2", "pivot_root"}  # bwrap's
    assert {"kexec_load", "init_module", "finit_module", "bpf", "ptrace", "keyctl", "perf_event_open",
            "process_vm_readv", "userfaultfd", "open_by_handle_at", "reboot", "swapon"} <= refused
