#!/usr/bin/env python3
"""Parse every manifest in deploy/k8s and check the fields docs/operations.md "Operations" asks
for. Prints TAP."""
import os
import sys

import yaml

root = sys.argv[1]
k8s = os.path.join(root, "deploy", "k8s")
docs = []
for name in sorted(os.listdir(k8s)):
    if name.endswith(".yaml"):
        with open(os.path.join(k8s, name)) as f:
            docs += [(name, d) for d in yaml.safe_load_all(f) if d]

checks = []


def check(desc, cond):
    checks.append((desc, bool(cond)))


def find(kind, name=None):
    for _, d in docs:
        if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name):
            return d
    return None


def size_bytes(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = str(s).rstrip("iB")
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


ds = find("DaemonSet", "ckptd")
check("a DaemonSet named ckptd", ds)
pod = ds["spec"]["template"]["spec"]
ctr = pod["containers"][0]
check("hostPID for legacy CUDA IPC", pod.get("hostPID") is True)
check("not hostNetwork", not pod.get("hostNetwork", False))
check("priority system-node-critical", pod.get("priorityClassName") == "system-node-critical")
terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
check("GPU node selector", any(e["key"] == "cloud.google.com/gke-accelerator" for t in terms for e in t["matchExpressions"]))
check("tolerates nvidia.com/gpu taint", any(t.get("key") == "nvidia.com/gpu" for t in pod["tolerations"]))
res = ctr.get("resources", {})
check("no nvidia.com/gpu request", all("nvidia.com/gpu" not in res.get(k, {}) for k in ("requests", "limits")))
vols = {v["name"]: v for v in pod["volumes"]}
mounts = {m["mountPath"]: m["name"] for m in ctr["volumeMounts"]}
check("hostPath /run/ckptd mounted at /run/ckptd",
      vols[mounts["/run/ckptd"]]["hostPath"]["path"] == "/run/ckptd")
check("NVIDIA driver mounted as GKE installs it",
      vols[mounts["/usr/local/nvidia"]]["hostPath"]["path"] == "/home/kubernetes/bin/nvidia")
sa = find("ServiceAccount", pod["serviceAccountName"])
check("Workload Identity service account", sa and "iam.gke.io/gcp-service-account" in sa["metadata"].get("annotations", {}))
port_names = {p.get("name"): p.get("containerPort") for p in ctr.get("ports", [])}
for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
    get = ctr.get(probe, {}).get("httpGet", {})
    check(f"{probe} asks {path} on the metrics port",
          get.get("path") == path and get.get("port") in ("metrics", port_names.get("metrics")))
listen = find("ConfigMap")["data"]["ckptd.conf"]
check("logs as JSON lines for the cluster's log pipeline", "format = json" in listen)
check("the config serves metrics (and the probes) on the metrics port",
      f":{port_names.get('metrics')}" in listen and "[metrics]" in listen)
ann = ds["spec"]["template"]["metadata"].get("annotations", {})
check("Prometheus scrape annotations", ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port"))
check("metrics port matches the annotation",
      any(str(p["containerPort"]) == ann.get("prometheus.io/port") for p in ctr.get("ports", [])))
cm = find("ConfigMap", "ckptd-config")
conf = cm["data"]["ckptd.conf"]
staging = next(l.split("=")[1].strip() for l in conf.splitlines() if l.strip().startswith("staging_bytes"))
check("memory request covers the staging pool", size_bytes(res["requests"]["memory"]) > size_bytes(staging))
check("grace period longer than the drain timeout",
      pod.get("terminationGracePeriodSeconds", 30) * 1000 >
      int(next(l.split("=")[1] for l in conf.splitlines() if l.strip().startswith("drain_timeout_ms"))))
trainer = find("Pod", "trainer-example")
check("trainer pod mounts the socket directory",
      any(v.get("hostPath", {}).get("path") == "/run/ckptd" for v in trainer["spec"]["volumes"]))
tspec = trainer["spec"]
tctr = tspec["containers"][0]
tenv = {e["name"]: e.get("value") for e in tctr.get("env", [])}
check("trainer pod on the VMM path: expandable segments, no hostPID",
      "expandable_segments:True" in (tenv.get("PYTORCH_CUDA_ALLOC_CONF") or "") and not tspec.get("hostPID"))
shm = [v for v in tspec["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
check("trainer pod mounts a memory emptyDir at /dev/shm",
      shm and any(m["mountPath"] == "/dev/shm" and m["name"] == shm[0]["name"] for m in tctr["volumeMounts"]))
check("trainer pod requests cpu and memory", all(k in tctr.get("resources", {}).get("requests", {})
                                                  for k in ("cpu", "memory")))
# Issue "Security": the base DaemonSet is hardened; GKE's privileged
# variant is a separate component that says why.
sc = ctr.get("securityContext", {})
check("not privileged; no privilege escalation",
      sc.get("privileged") is False and sc.get("allowPrivilegeEscalation") is False)
check("seccompProfile RuntimeDefault", sc.get("seccompProfile", {}).get("type") == "RuntimeDefault")
caps = sc.get("capabilities", {})
check("drops ALL capabilities, adds only IPC_LOCK and SYS_PTRACE",
      caps.get("drop") == ["ALL"] and sorted(caps.get("add", [])) == ["IPC_LOCK", "SYS_PTRACE"])
check("read-only root filesystem, with a private /tmp",
      sc.get("readOnlyRootFilesystem") is True and "/tmp" in mounts and "emptyDir" in vols[mounts["/tmp"]])
check("no host /dev in the base DaemonSet", "/dev" not in mounts)
with open(os.path.join(k8s, "gke-gpu", "kustomization.yaml")) as f:
    comp = yaml.safe_load(f)
ops = yaml.safe_load(comp["patches"][0]["patch"])
check("gke-gpu component: privileged with the host's /dev, said why",
      comp["kind"] == "Component" and any(o["path"].endswith("/securityContext") and o["value"].get("privileged")
                                          for o in ops)
      and any(o["value"].get("hostPath", {}).get("path") == "/dev" for o in ops if o["op"] == "add")
      and "dcgm-exporter" in open(os.path.join(k8s, "gke-gpu", "kustomization.yaml")).read())
with open(os.path.join(root, "deploy", "k8s-gke", "kustomization.yaml")) as f:
    gke = yaml.safe_load(f)
check("deploy/k8s-gke is the base with the gke-gpu component",
      gke["resources"] == ["../k8s"] and gke["components"] == ["../k8s/gke-gpu"])
ns = find("Namespace", "ckptd-system")
check("the agent's namespace admits its privileged pods (Pod Security)",
      ns and ns["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") == "privileged")
# Peer replication (docs/tiers.md "Tiers").
svc = find("Service", "ckptd-peers")
check("a headless Service ckptd-peers selects the ckptd pods, not-ready ones too",
      svc and svc["spec"].get("clusterIP") == "None" and svc["spec"].get("publishNotReadyAddresses") is True
      and all(ds["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items()))
check("the peers port is the container's and the Service's",
      port_names.get("peers") == 7070 and any(p.get("targetPort") == "peers" and p.get("port") == 7070
                                                for p in svc["spec"]["ports"]))
check("the config's [peers] dns is the Service's name and port, listen the port",
      "dns = ckptd-peers.ckptd-system.svc.cluster.local:7070" in conf and "listen = 0.0.0.0:7070" in conf)
check("each pod advertises its own address (POD_IP from the downward API)",
      "peers.advertise=$(POD_IP):7070" in ctr["args"]
      and any(e["name"] == "POD_IP" and e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP"
              for e in ctr.get("env", [])))
tls = vols.get(mounts.get("/etc/ckptd-peer"), {})
check("the peers' certificates from the Secret ckptd-peer-tls, optional, where [peers] reads them",
      tls.get("secret", {}).get("secretName") == "ckptd-peer-tls" and tls["secret"].get("optional") is True
      and all(f"/etc/ckptd-peer/{f}" in conf for f in ("tls.crt", "tls.key", "ca.crt")))
kust = find("Kustomization")
check("kustomization resources exist", kust and all(os.path.exists(os.path.join(k8s, r)) for r in kust["resources"]))
check("Dockerfile is multi-stage on Debian 12",
      open(os.path.join(root, "deploy", "Dockerfile")).read().count("FROM debian:12") == 2)

print(f"1..{len(checks)}")
for i, (desc, ok) in enumerate(checks, 1):
    print(f"{'ok' if ok else 'not ok'} {i} - {desc}")
sys.exit(0 if all(ok for _, ok in checks) else 1)
