"""Pod Security Standards (pure): the checks of the PodSecurity admission plugin, as a library.

``redrafter-operator check`` runs them on the pods the operator will create for a spec, against the level
the namespace enforces, before any Pod exists; kube-apiserver's own plugin admits the Pods, and
tests/integration/test_pod_admission.py holds the operator's pods to its verdicts.

A namespace labelled ``pod-security.kubernetes.io/enforce: baseline|restricted`` gets its Pods checked
against that Pod Security Standards level; a violation is a 403 Forbidden whose message has the real
plugin's shape: ``pods "x" is forbidden: violates PodSecurity "restricted:latest": <reason> (<detail>),
...``. Checks, reasons and details follow kubernetes/pod-security-admission policy/check_*.go (the
latest versions, Linux pods): every baseline check (AppArmor, capabilities, host namespaces, hostPath
volumes, host ports, probe/lifecycle hosts, privileged, procMount, SELinux, seccomp, sysctls, Windows
host process) and every restricted one (allowPrivilegeEscalation, capabilities drop ALL, volume types,
runAsNonRoot, runAsUser != 0, seccompProfile RuntimeDefault/Localhost). Like the real
plugin it enforces on Pods only: workload objects (Deployments, Jobs) are admitted, and their
controllers' Pod creations are what fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
LEVELS = ("privileged", "baseline", "restricted")
#: volume types the restricted level allows (check_restrictedVolumes.go)
RESTRICTED_VOLUMES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
#: sysctls the baseline level allows (check_sysctls.go, latest)
SAFE_SYSCTLS = (
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_notsent_lowat",
)
#: SELinux types the baseline level allows (check_seLinuxOptions.go, 1.31+)
SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
#: capabilities the baseline level allows adding (check_capabilities_baseline.go)
BASELINE_CAPABILITIES = (
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
)

Spec = Mapping[str, Any]
Result = tuple[str, str] | None  # (forbidden reason, forbidden detail) or None when allowed


def _containers(spec: Spec) -> Iterator[Mapping[str, Any]]:
    """visitContainers: init, regular and ephemeral containers, in that order."""
    for field in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(field) or []


def _sc(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return container.get("securityContext") or {}


def _pod_sc(spec: Spec) -> Mapping[str, Any]:
    return spec.get("securityContext") or {}


def _plural(singular: str, plural: str, n: int) -> str:
    return singular if n == 1 else plural


def _quote(items: list[str]) -> str:
    return ", ".join(f'"{i}"' for i in items)


def _who(names: list[str]) -> str:
    return f"{_plural('container', 'containers', len(names))} {_quote(names)}"


# ---- baseline ----------------------------------------------------------------------------------


def _privileged(spec: Spec) -> Result:
    bad = [c["name"] for c in _containers(spec) if _sc(c).get("privileged") is True]
    return ("privileged", f"{_who(bad)} must not set securityContext.privileged=true") if bad else None


def _host_namespaces(spec: Spec) -> Result:
    bad = [f"{f}=true" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f) is True]
    return ("host namespaces", ", ".join(bad)) if bad else None


def _host_ports(spec: Spec) -> Result:
    bad, ports = [], set()
    for c in _containers(spec):
        used = [p["hostPort"] for p in c.get("ports") or [] if p.get("hostPort")]
        if used:
            bad.append(c["name"])
            ports |= {str(p) for p in used}
    if not bad:
        return None
    return (
        "hostPort",
        f"{_who(bad)} {_plural('uses', 'use', len(bad))} "
        f"{_plural('hostPort', 'hostPorts', len(ports))} {', '.join(sorted(ports))}",
    )


def _capabilities_baseline(spec: Spec) -> Result:
    bad, caps = [], set()
    for c in _containers(spec):
        added = [a for a in (_sc(c).get("capabilities") or {}).get("add") or [] if a not in BASELINE_CAPABILITIES]
        if added:
            bad.append(c["name"])
            caps |= set(added)
    if not bad:
        return None
    return (
        "non-default capabilities",
        f"{_who(bad)} must not include {_quote(sorted(caps))} in securityContext.capabilities.add",
    )


def _app_armor(spec: Spec, meta: Mapping[str, Any]) -> Result:
    def ok(profile: Any) -> bool:
        return not isinstance(profile, Mapping) or profile.get("type") in ("RuntimeDefault", "Localhost")

    setters, values = [], set()
    if not ok(_pod_sc(spec).get("appArmorProfile")):
        setters.append("pod")
        values.add(str(_pod_sc(spec)["appArmorProfile"].get("type")))
    bad = [c["name"] for c in _containers(spec) if not ok(_sc(c).get("appArmorProfile"))]
    values |= {str(_sc(c)["appArmorProfile"].get("type")) for c in _containers(spec) if c["name"] in bad}
    if bad:
        setters.append(_who(bad))
    annotations = sorted(
        f'{k}="{v}"'
        for k, v in ((meta.get("annotations") or {}).items())
        if k.startswith(APPARMOR_ANNOTATION) and v and v != "runtime/default" and not v.startswith("localhost/")
    )
    if annotations:
        setters.append(_plural("annotation", "annotations", len(annotations)))
        values |= {a.split("=", 1)[1].strip('"') for a in annotations}
    if not setters:
        return None
    return (
        _plural("forbidden AppArmor profile", "forbidden AppArmor profiles", len(values)),
        f"{' and '.join(setters)} must not set AppArmor profile type to {_quote(sorted(values))}",
    )


def _host_probes(spec: Spec) -> Result:
    bad, hosts = [], set()
    for c in _containers(spec):
        handlers = [c.get(p) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
        handlers += [(c.get("lifecycle") or {}).get(h) for h in ("postStart", "preStop")]
        found = {h[k]["host"] for h in handlers if h for k in ("httpGet", "tcpSocket") if (h.get(k) or {}).get("host")}
        if found:
            bad.append(c["name"])
            hosts |= found
    if not bad:
        return None
    return (
        "probe or lifecycle host",
        f"{_who(bad)} {_plural('uses', 'use', len(bad))} "
        f"{_plural('probe or lifecycle host', 'probe or lifecycle hosts', len(hosts))} {_quote(sorted(hosts))}",
    )


def _proc_mount(spec: Spec) -> Result:
    bad = [c["name"] for c in _containers(spec) if _sc(c).get("procMount") not in (None, "Default")]
    if not bad or spec.get("hostUsers") is False:
        return None
    types = sorted({str(_sc(c)["procMount"]) for c in _containers(spec) if c["name"] in bad})
    return "procMount", f"{_who(bad)} must not set securityContext.procMount to {_quote(types)}"


def _se_linux(spec: Spec) -> Result:
    types, user, role = set(), False, False

    def ok(opts: Any) -> bool:
        nonlocal user, role
        if not isinstance(opts, Mapping):
            return True
        good = True
        if opts.get("type", "") not in SELINUX_TYPES:
            types.add(opts["type"])
            good = False
        if opts.get("user"):
            user, good = True, False
        if opts.get("role"):
            role, good = True, False
        return good

    setters = [] if ok(_pod_sc(spec).get("seLinuxOptions")) else ["pod"]
    bad = [c["name"] for c in _containers(spec) if not ok(_sc(c).get("seLinuxOptions"))]
    if bad:
        setters.append(_who(bad))
    if not setters:
        return None
    data = (
        ([f"{_plural('type', 'types', len(types))} {_quote(sorted(types))}"] if types else [])
        + (["user may not be set"] if user else [])
        + (["role may not be set"] if role else [])
    )
    return "seLinuxOptions", f"{' and '.join(setters)} set forbidden securityContext.seLinuxOptions: {'; '.join(data)}"


def _seccomp_baseline(spec: Spec) -> Result:
    setters = ["pod"] if (_pod_sc(spec).get("seccompProfile") or {}).get("type") == "Unconfined" else []
    bad = [c["name"] for c in _containers(spec) if (_sc(c).get("seccompProfile") or {}).get("type") == "Unconfined"]
    if bad:
        setters.append(_who(bad))
    if not setters:
        return None
    return "seccompProfile", f'{" and ".join(setters)} must not set securityContext.seccompProfile.type to "Unconfined"'


def _sysctls(spec: Spec) -> Result:
    bad = [s["name"] for s in _pod_sc(spec).get("sysctls") or [] if s.get("name") not in SAFE_SYSCTLS]
    return ("forbidden sysctls", ", ".join(bad)) if bad else None


def _windows_host_process(spec: Spec) -> Result:
    setters = ["pod"] if (_pod_sc(spec).get("windowsOptions") or {}).get("hostProcess") is True else []
    bad = [c["name"] for c in _containers(spec) if (_sc(c).get("windowsOptions") or {}).get("hostProcess") is True]
    if bad:
        setters.append(_who(bad))
    if not setters:
        return None
    return "hostProcess", f"{' and '.join(setters)} must not set securityContext.windowsOptions.hostProcess=true"


def _restricted_volumes(spec: Spec) -> Result:
    bad, types = [], set()
    for v in spec.get("volumes") or []:
        kinds = [k for k in v if k != "name"]
        if not any(k in RESTRICTED_VOLUMES for k in kinds):
            bad.append(v["name"])
            types |= set(kinds) or {"unknown"}
    if not bad:
        return None
    return (
        "restricted volume types",
        f"{_plural('volume', 'volumes', len(bad))} {_quote(bad)} {_plural('uses', 'use', len(bad))} "
        f"{_plural('restricted volume type', 'restricted volume types', len(types))} {_quote(sorted(types))}",
    )


def _host_path_volumes(spec: Spec) -> Result:
    bad = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    return ("hostPath volumes", f"{_plural('volume', 'volumes', len(bad))} {_quote(bad)}") if bad else None


# ---- restricted --------------------------------------------------------------------------------


def _allow_privilege_escalation(spec: Spec) -> Result:
    bad = [c["name"] for c in _containers(spec) if _sc(c).get("allowPrivilegeEscalation") is not False]
    return (
        ("allowPrivilegeEscalation != false", f"{_who(bad)} must set securityContext.allowPrivilegeEscalation=false")
        if bad
        else None
    )


def _capabilities_restricted(spec: Spec) -> Result:
    missing_drop, adding, caps = [], [], set()
    for c in _containers(spec):
        capabilities = _sc(c).get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            missing_drop.append(c["name"])
        added = [a for a in capabilities.get("add") or [] if a != "NET_BIND_SERVICE"]
        if added:
            adding.append(c["name"])
            caps |= set(added)
    details = []
    if missing_drop:
        details.append(f'{_who(missing_drop)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(f"{_who(adding)} must not include {_quote(sorted(caps))} in securityContext.capabilities.add")
    return ("unrestricted capabilities", "; ".join(details)) if details else None


def _pod_or_containers(spec: Spec, field: str, ok: Callable[[Any], bool]) -> tuple[list[str], list[str], bool]:
    """(explicitly bad setters incl. "pod", containers left unset without a good pod value, pod value ok)."""
    pod_value = _pod_sc(spec).get(field)
    bad_setters = ["pod"] if pod_value is not None and not ok(pod_value) else []
    pod_ok = pod_value is not None and ok(pod_value)
    explicit, implicit = [], []
    for c in _containers(spec):
        value = _sc(c).get(field)
        if value is not None:
            if not ok(value):
                explicit.append(c["name"])
        elif not pod_ok:
            implicit.append(c["name"])
    if explicit:
        bad_setters.append(_who(explicit))
    return bad_setters, implicit, pod_ok


def _run_as_non_root(spec: Spec) -> Result:
    bad, implicit, _ = _pod_or_containers(spec, "runAsNonRoot", lambda v: v is True)
    if bad:
        return "runAsNonRoot != true", f"{' and '.join(bad)} must not set securityContext.runAsNonRoot=false"
    if implicit:
        return "runAsNonRoot != true", f"pod or {_who(implicit)} must set securityContext.runAsNonRoot=true"
    return None


def _run_as_user(spec: Spec) -> Result:
    bad = ["pod"] if _pod_sc(spec).get("runAsUser") == 0 else []
    zero = [c["name"] for c in _containers(spec) if _sc(c).get("runAsUser") == 0]
    if zero:
        bad.append(_who(zero))
    return ("runAsUser=0", f"{' and '.join(bad)} must not set runAsUser=0") if bad else None


def _seccomp_restricted(spec: Spec) -> Result:
    def valid(profile: Any) -> bool:
        return isinstance(profile, Mapping) and profile.get("type") in ("RuntimeDefault", "Localhost")

    bad, implicit, _ = _pod_or_containers(spec, "seccompProfile", valid)
    if bad:
        values = {
            str(p.get("type"))
            for p in [_pod_sc(spec).get("seccompProfile"), *(_sc(c).get("seccompProfile") for c in _containers(spec))]
            if isinstance(p, Mapping) and not valid(p)
        }
        return (
            "seccompProfile",
            f"{' and '.join(bad)} must not set securityContext.seccompProfile.type to {_quote(sorted(values))}",
        )
    if implicit:
        return "seccompProfile", (
            f'pod or {_who(implicit)} must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"'
        )
    return None


# In the plugin's order: baseline then restricted, each sorted by check ID (policy/registry.go).
BASELINE: tuple[Callable[[Spec], Result], ...] = (
    _capabilities_baseline,
    _host_namespaces,
    _host_path_volumes,
    _host_ports,
    _host_probes,
    _privileged,
    _proc_mount,
    _se_linux,
    _seccomp_baseline,
    _sysctls,
    _windows_host_process,
)
RESTRICTED: tuple[Callable[[Spec], Result], ...] = (
    _allow_privilege_escalation,
    _capabilities_restricted,
    _restricted_volumes,
    _run_as_non_root,
    _run_as_user,
    _seccomp_restricted,
)


def violations(pod_spec: Spec, level: str = "restricted", pod_meta: Mapping[str, Any] | None = None) -> list[str]:
    """``reason (detail)`` of each check ``pod_spec`` fails at ``level``, in the plugin's order."""
    checks = (BASELINE if level in ("baseline", "restricted") else ()) + (RESTRICTED if level == "restricted" else ())
    if level == "restricted":  # the restricted capability, volume and seccomp checks override their baseline ones
        overridden = (_capabilities_baseline, _host_path_volumes, _seccomp_baseline)  # OverrideCheckIDs upstream
        checks = tuple(c for c in checks if c not in overridden)
    out = []
    app_armor = _app_armor(pod_spec, pod_meta or {}) if level != "privileged" else None
    for check in checks:
        result = check(pod_spec)
        if result:
            reason, detail = result
            out.append(f"{reason} ({detail})" if detail else reason)
    if app_armor:  # appArmorProfile sorts first among the baseline checks
        out.insert(0, f"{app_armor[0]} ({app_armor[1]})")
    return out


def namespace_policy(labels: Mapping[str, str]) -> tuple[str, str]:
    """(level, version) enforced by a namespace's labels; an unparsable level means restricted:latest."""
    level = labels.get(ENFORCE_LABEL, "privileged")
    version = labels.get(ENFORCE_VERSION_LABEL, "latest")
    if level not in LEVELS:
        return "restricted", "latest"
    return level, version


def admit_pod(pod: Mapping[str, Any], namespace_labels: Mapping[str, str]) -> str | None:
    """The Forbidden message for a Pod the namespace's enforce level rejects, else None."""
    level, version = namespace_policy(namespace_labels)
    if level == "privileged":
        return None
    found = violations(pod.get("spec") or {}, level, pod.get("metadata") or {})
    if not found:
        return None
    name = (pod.get("metadata") or {}).get("name", "")
    return f'pods "{name}" is forbidden: violates PodSecurity "{level}:{version}": {", ".join(found)}'
