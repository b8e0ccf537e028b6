"""deploy/: what can be checked without a cluster, a system manager or a Docker engine.

- systemd: `systemd-analyze verify` on both units (it works on files; there need not be a
  running systemd), with no warning at all; and it must notice a broken copy.
- Kubernetes: every manifest against the Kubernetes schemas, offline, with PyPI's
  kubernetes-validate (its schemas ship inside the package), strictly (unknown fields fail); and
  the manifests agree with each other (the Service selects node 0's daemon, ports, names).
- Docker: the Dockerfile parsed by Docker's own parser (PyPI's `dockerfile`), its stages, its
  install steps (the project's install script), every file it copies present in a build, and
  the runtime packages covering every shared library the daemon and the client library link.
"""

import os
import re
import shutil
import subprocess

import pytest

from conftest import REPO

DEPLOY = REPO / "deploy"


# ---- systemd ----

@pytest.mark.parametrize("unit,as_name", [("sparsyncd.service", "sparsyncd.service"),
                                          ("sparsyncd@.service", "sparsyncd@job1.service")])
def test_systemd_units_verify_cleanly(tmp_path, unit, as_name):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("needs systemd-analyze (deploy/install_deps.sh: systemd)")
    text = (DEPLOY / "systemd" / unit).read_text()
    for key in ("EnvironmentFile=", "RuntimeDirectory=sparsync", "RuntimeDirectoryMode=0700",
                "LoadCredential=job-token:", "NoNewPrivileges=yes", "ProtectSystem=strict"):
        assert key in text, key
    assert "--job-token" not in text  # the token never goes on a command line
    good = tmp_path / as_name
    good.write_text(text)
    r = subprocess.run([analyze, "verify", str(good)], capture_output=True, text=True)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
    # The check can fail: a misspelt key and a bad value are reported.
    bad = tmp_path / "broken" / as_name
    bad.parent.mkdir()
    bad.write_text(text.replace("ProtectSystem=strict", "ProtectSystem=bogus")
                   .replace("RestrictRealtime=", "RestrictRealtim="))
    r = subprocess.run([analyze, "verify", str(bad)], capture_output=True, text=True)
    assert "bogus" in r.stderr and "RestrictRealtim" in r.stderr, r.stderr


# ---- Kubernetes ----

def manifests():
    yaml = pytest.importorskip("yaml")
    docs = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def test_kubernetes_manifests_validate_against_the_schemas(tmp_path):
    validate = shutil.which("kubernetes-validate") or str(REPO / ".venv" / "bin" /
                                                         "kubernetes-validate")
    if not os.path.exists(validate):
        pytest.skip("needs kubernetes-validate (deploy/install_deps.sh installs it from PyPI)")
    files = sorted(str(p) for p in (DEPLOY / "k8s").glob("*.yaml"))
    assert len(files) >= 6
    r = subprocess.run([validate, "--strict", "--quiet"] + files, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # The validator does fail: an unknown field and a wrong type.
    bad = tmp_path / "bad.yaml"
    bad.write_text((DEPLOY / "k8s" / "workers-job.yaml").read_text()
                   .replace("backoffLimit: 0", "backoffLimit: none\n  retries: 3"))
    r = subprocess.run([validate, "--strict", "--quiet", str(bad)], capture_output=True,
                       text=True)
    assert r.returncode != 0, r.stdout + r.stderr


def test_kubernetes_manifests_agree_with_each_other():
    docs = manifests()
    service = docs[("Service", "sparsync-coordinator")]
    coordinator = docs[("DaemonSet", "sparsyncd-coordinator")]
    peers = docs[("DaemonSet", "sparsyncd")]
    job = docs[("Job", "sparsync-train")]
    config = docs[("ConfigMap", "sparsync-job")]
    assert service["spec"]["clusterIP"] == "None"  # headless
    labels = coordinator["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    peer_labels = peers["spec"]["template"]["metadata"]["labels"]
    assert not all(peer_labels.get(k) == v for k, v in service["spec"]["selector"].items()), \
        "the Service must select node 0's daemon only"
    for ds in (coordinator, peers):
        pod = ds["spec"]["template"]["spec"]
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["SPARSYNC_JOB_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == \
            "sparsync-job-token"
        assert ":29400" in env["SPARSYNC_COORDINATOR"]["value"]
        # Every variable the container's script uses is defined for it.
        script = " ".join(pod["containers"][0]["args"])
        for var in set(re.findall(r"\$\{?([A-Z_]+)", script)) - {"SPARSYNC_NODE_RANK"}:
            assert var in env or var in config["data"], (ds["metadata"]["name"], var)
        assert set(env) >= {"NODE_NAME", "SPARSYNC_LISTEN", "SPARSYNC_COORDINATOR"}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["sparsync-run"]["hostPath"]["path"] == "/run/sparsync"
        assert "0700" in " ".join(pod["initContainers"][0]["command"])
    assert "sparsync-coordinator.sparsync.svc" in \
        {e["name"]: e for e in peers["spec"]["template"]["spec"]["containers"][0]["env"]}[
            "SPARSYNC_COORDINATOR"]["value"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == int(config["data"]["SPARSYNC_NUM_NODES"])
    assert config["data"]["SPARSYNC_SOCKET"].startswith("/run/sparsync/job/")
    assert len(config["data"]["peers"].split()) == int(config["data"]["SPARSYNC_NUM_NODES"]) - 1


# ---- Docker ----

def test_dockerfile_parses_and_copies_what_a_build_makes(daemon):
    dockerfile = pytest.importorskip("dockerfile")
    commands = dockerfile.parse_file(str(DEPLOY / "docker" / "Dockerfile"))
    froms = [c.value for c in commands if c.cmd.upper() == "FROM"]
    assert [f[0] for f in froms] == ["debian:12", "debian:12-slim"]
    assert [f[-1] for f in froms] == ["build", "runtime"]
    runs = [" ".join(c.value) for c in commands if c.cmd.upper() == "RUN"]
    assert "bash deploy/install_deps.sh" in runs[0]
    assert "install_deps.sh --runtime" in runs[1]
    assert not any("apt-get install" in r for r in runs), "installs go through the script"
    for c in commands:
        if c.cmd.upper() != "COPY":
            continue
        *sources, _ = c.value
        for src in sources:
            if any(f.startswith("--from=build") for f in c.flags):
                # The build stage works in /src, a copy of the checkout: the same paths here.
                assert src.startswith("/src/")
                assert (REPO / src[len("/src/"):]).is_file(), src
            elif src != ".":
                assert (REPO / src).exists(), src
    ignore = (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignore and "build" in ignore


def runtime_packages():
    text = (DEPLOY / "install_deps.sh").read_text()
    body = re.search(r"runtime_packages=\((.*?)\)", text, re.DOTALL).group(1)
    return [w for line in body.splitlines() for w in line.split("#")[0].split()]


def test_the_runtime_image_has_every_library_the_binaries_link(daemon):
    if shutil.which("apt-cache") is None or shutil.which("dpkg") is None:
        pytest.skip("needs dpkg and apt-cache (Debian)")
    client = REPO / "build" / "shims" / "client" / "libsparsync_client.so"
    libs = set()
    for binary in (daemon, str(client)):
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        found = re.findall(r"=> (/\S+)", out)
        assert found, out
        # A CUDA toolkit installed by hand (/usr/local) is not in the image: it builds without.
        libs |= {os.path.realpath(lib) for lib in found if not lib.startswith("/usr/local/")}
    # Debian 12 merges /lib into /usr/lib; dpkg knows each file under the name it shipped.
    names = sorted(libs | {lib.replace("/usr/lib/", "/lib/", 1) for lib in libs})
    owners = {}
    r = subprocess.run(["dpkg", "-S"] + names, capture_output=True, text=True)
    for line in r.stdout.splitlines():
        package, _, path = line.partition(": ")
        owners[path.replace("/usr/lib/", "/lib/", 1)] = package.split(":")[0]
    libraries = [p for p in runtime_packages() if p.startswith("lib")]
    closure = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
         "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"] + libraries,
        capture_output=True, text=True, check=True).stdout
    have = {line.split(":")[-1].strip() for line in closure.splitlines() if line.strip()}
    have = {h.split(":")[0] for h in have}
    for lib in sorted(libs):
        owner = owners.get(lib.replace("/usr/lib/", "/lib/", 1))
        assert owner, "no Debian package owns %s" % lib
        assert owner in have, "%s (for %s) is not in the runtime image's packages" % (owner, lib)
