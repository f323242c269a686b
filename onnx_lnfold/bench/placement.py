"""Sessions on the execution provider asked for, and the proof that every timed node ran there.

A session asked for one provider can end up on the CPU in four ways; each one is closed here:

1. onnxruntime's Python `InferenceSession` retries a session that fails to be created (or a run that
   fails) on `CPUExecutionProvider` and only prints a banner: sessions are created with
   `enable_fallback=0`, so the error is raised instead;
2. an onnxruntime without the provider (the CPU wheel asked for CUDA) warns and builds the session
   on the CPU: `get_providers()[0]` must be the provider asked for, else `PlacementError`;
3. nodes without a kernel on the provider go to the CPU EP. For graphs without shape arithmetic (the
   calibration's chains, a probe) CPU fallback is disabled with the session config
   `session.disable_cpu_ep_fallback` = "1" (kOrtSessionOptionsDisableCPUEPFallback,
   onnxruntime_session_options_config_keys.h), so InferenceSession::Initialize fails with "This
   session contains graph nodes that are assigned to the default CPU EP, but fallback to CPU EP has
   been explicitly disabled by the user." (inference_session.cc), turned into a one-line
   `PlacementError`;
4. models with dynamic shapes cannot be created with that config at all: the CUDA EP's
   GetCapability hands the nodes that compute shapes from `Shape` outputs (Gather, Squeeze, Range,
   Concat of int64 scalars) to the CPU EP on purpose (GetCpuPreferredNodes,
   fallback_cpu_capability.cc). Those sessions are profiled, and every node that ran off the provider
   asked for must be shape arithmetic: every tensor it read or wrote, in every profiled run, is an
   integer or bool tensor (`check_assignment`). Any other node is a `PlacementError` that names it.
"""

from __future__ import annotations

DISABLE_CPU_FALLBACK = "session.disable_cpu_ep_fallback"  # kOrtSessionOptionsDisableCPUEPFallback
ORT_CPU_FALLBACK_ERROR = "assigned to the default CPU EP"  # in the Initialize() error quoted above
CPU = "CPUExecutionProvider"

# Element types of shape arithmetic: a node off the device that only touches these computes shapes.
SHAPE_TYPES = {"int64", "int32", "bool"}


class PlacementError(Exception):
    """A session did not run (entirely) on the provider asked for: nothing of it is reported."""


def provider_name(text: str, available: list[str] | None = None) -> str:
    """`cuda`, `CUDA` or `CUDAExecutionProvider` -> `CUDAExecutionProvider`: a known provider's name
    (onnxruntime's `get_all_providers()`), matched without case and without the suffix."""
    if available is None:
        import onnxruntime as ort

        available = list(ort.get_all_providers())
    want = text.lower().removesuffix("executionprovider")
    for name in available:
        if name.lower().removesuffix("executionprovider") == want:
            return name
    return text


def create_session(ort, model, so, provider: str, provider_options: dict | None, label: str, *, strict: bool = False):
    """A session on `provider`, or PlacementError. `strict`: CPU fallback disabled (graphs without
    shape arithmetic); otherwise the caller checks the placement from a profile (`check_assignment`)."""
    if strict and provider != CPU:
        so.add_session_config_entry(DISABLE_CPU_FALLBACK, "1")
    providers = [(provider, provider_options)] if provider_options else [provider]
    source = model if isinstance(model, (bytes, str)) else str(model)
    try:
        # enable_fallback=0: no silent retry on CPUExecutionProvider (onnxruntime_inference_collection.py)
        sess = ort.InferenceSession(source, so, providers=providers, enable_fallback=0)
    except Exception as e:  # noqa: BLE001 - the message is the reason
        if ORT_CPU_FALLBACK_ERROR in str(e):
            raise PlacementError(f"{label}: onnxruntime assigned nodes to the CPU EP while {provider} was asked "
                                 f"with CPU fallback disabled ({DISABLE_CPU_FALLBACK}=1)") from None
        raise
    check_providers(sess, provider, label)
    return sess


def check_providers(sess, expected: str, label: str) -> None:
    got = list(sess.get_providers())
    if not got or got[0] != expected:
        raise PlacementError(f"{label}: the session runs on {got[0] if got else 'no provider'}, not {expected} "
                             f"(providers {', '.join(got)})")


def node_events(events: list[dict]) -> list[dict]:
    """The profile's per-node kernel events ({"cat": "Node", "name": NODE_kernel_time, "args": {...}})."""
    out = []
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        args = e.get("args", {})
        types = {t for key in ("input_type_shape", "output_type_shape") for entry in args.get(key, []) or []
                 for t in (entry if isinstance(entry, dict) else {})}
        out.append({"node": e["name"][: -len("_kernel_time")], "op": args.get("op_name", ""),
                    "provider": args.get("provider", ""), "types": types, "ts": e.get("ts", 0), "dur": e.get("dur", 0)})
    return out


def off_device_nodes(profile_events: list[dict], expected: str) -> tuple[list, list]:
    """(shape nodes, offending nodes) among the nodes that ran off `expected` in the profiled runs: a
    shape node read and wrote only integer/bool tensors in every run; anything else offends. (The
    profile, not `get_provider_graph_assignment_info()`: that records the partitioning before the
    later fusions, so it names nodes that never run and misses the fused ones that do.)"""
    ran: dict[str, dict] = {}
    for e in node_events(profile_events):
        node = ran.setdefault(e["node"], {"node": e["node"], "op": e["op"], "providers": set(), "types": set()})
        node["providers"].add(e["provider"])
        node["types"] |= e["types"]
    shape, offending = [], []
    for node in ran.values():
        off = sorted(p for p in node["providers"] if p != expected)
        if not off:
            continue
        entry = {"node": node["node"], "op": node["op"], "provider": off[0], "types": sorted(node["types"])}
        (shape if node["types"] and node["types"] <= SHAPE_TYPES else offending).append(entry)
    return shape, offending


def check_assignment(sess, profile_events: list[dict], expected: str, label: str) -> list[dict]:
    """PlacementError if the session is not on `expected`, or if any node that ran off it handled
    float data; returns the shape nodes onnxruntime kept off the device (recorded with the results)."""
    check_providers(sess, expected, label)
    return check_profile(profile_events, expected, label)


def check_profile(profile_events: list[dict], expected: str, label: str) -> list[dict]:
    """`check_assignment` from the profile alone (a session that has ended)."""
    shape, offending = off_device_nodes(profile_events, expected)
    if offending:
        o = offending[0]
        more = f" (+{len(offending) - 1} more)" if len(offending) > 1 else ""
        raise PlacementError(f"{label}: node '{o['node']}' ({o['op']}) runs on {o['provider']}, not {expected}, "
                             f"with {', '.join(o['types']) or 'untyped'} data{more}: it would be timed as {expected}")
    return shape
