"""Dispatcher-level meters used inside a rank: communication bytes and peak tensor memory.

Both are ``TorchDispatchMode`` subclasses, so they see every ATen and c10d operator a rank runs,
whoever issues it: DTensor / tensor-parallel functional collectives, FSDP2 all-gathers and
reduce-scatters, DDP bucket all-reduces (the C++ reducer calls the c10d operators through the
dispatcher), ZeroRedundancyOptimizer broadcasts and the pipeline's ``send`` / ``recv``.

Communication: each collective is recorded with its process group (mapped to a parallel
dimension by the worker), the *full buffer* size (all-gather output, reduce-scatter input,
all-reduce buffer, p2p tensor) and the bytes this rank sends under the ring algorithm:

=================  ===================================
op                 bytes sent per rank
=================  ===================================
all_reduce         2 (n-1)/n * buffer
all_gather         (n-1)/n * output buffer
reduce_scatter     (n-1)/n * input buffer
broadcast, other   (n-1)/n * buffer (root's n-1 copies averaged over ranks)
send / recv        buffer / 0
=================  ===================================

References: Patarasuk & Yuan 2009 (bandwidth-optimal ring all-reduce); NCCL-tests
``doc/PERFORMANCE.md`` (bus bandwidth factors 2(n-1)/n and (n-1)/n).

Memory: live tensor storages are tracked by weak reference (deduplicated, so views are counted
once); the running sum of their sizes gives the current and peak tensor bytes of the rank.
``UntypedStorage.resize_`` is patched while a meter is active, because FSDP2 frees and
re-allocates unsharded parameters with ``resize_(0)`` / ``resize_(n)``. Allocator caching,
fragmentation and the framework's own buffers are not included (on CPU there is no caching
allocator; on GPU compare with ``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import os
import weakref
from collections import Counter

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["CommMeter", "PeakMemMeter", "op_kind", "sent_bytes"]

_COMM_NS = {"c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd"}
_SKIP = {"wait_tensor", "barrier", "monitored_barrier", "_wrap_tensor_autograd"}


def op_kind(name: str) -> str:
    """Canonical collective name of a c10d / functional op (``_allgather_base_`` -> all_gather)."""
    n = name.strip("_").replace("_", "")
    for key, kind in (
        ("reducescatter", "reduce_scatter"),
        ("allgather", "all_gather"),
        ("allreduce", "all_reduce"),
        ("alltoall", "all_to_all"),
        ("broadcast", "broadcast"),
        ("send", "send"),
        ("recv", "recv"),
        ("reduce", "reduce"),
        ("gather", "gather"),
        ("scatter", "scatter"),
    ):
        if n.startswith(key):
            return kind
    return n


def sent_bytes(kind: str, buffer_bytes: float, group_size: int) -> float:
    """Bytes one rank sends for a collective of ``buffer_bytes`` over ``group_size`` ranks (ring)."""
    n = max(int(group_size), 1)
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n * buffer_bytes
    if kind == "send":
        return float(buffer_bytes)
    if kind == "recv":
        return 0.0
    return (n - 1) / n * buffer_bytes


def _nbytes(x) -> int:
    return sum(
        t.numel() * t.element_size() for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)
    )


def _group_of(args) -> dist.ProcessGroup | None:
    from torch.distributed import distributed_c10d as c10d

    for a in tree_flatten(list(args))[0]:
        if isinstance(a, torch.ScriptObject):
            try:
                return dist.ProcessGroup.unbox(a)
            except Exception:  # noqa: BLE001, S112 - not a process group
                continue
        if isinstance(a, str):
            try:
                return c10d._resolve_process_group(a)
            except Exception:  # noqa: BLE001, S112 - a reduce-op name, not a group
                continue
    return None


class CommMeter(TorchDispatchMode):
    """Counts calls and bytes of every collective, keyed by (kind, group name, group size)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter = Counter()
        self.buffer_bytes: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(getattr(t, "__name__", "") == "DTensor" for t in types):
            return NotImplemented  # let DTensor desugar into functional collectives first
        out = func(*args, **kwargs)
        if func.namespace in _COMM_NS and func._overloadpacket.__name__ not in _SKIP:
            pg = _group_of(list(args) + list(kwargs.values()))
            name = pg.group_name if pg is not None else "?"
            size = pg.size() if pg is not None else 1
            key = (op_kind(func._overloadpacket.__name__), name, size)
            nb = max([_nbytes(a) for a in list(args) + list(kwargs.values())] + [_nbytes(out)])
            self.calls[key] += 1
            self.buffer_bytes[key] += nb
        return out

    def records(self, dim_of_group: dict[str, str]) -> list[dict]:
        """One dict per (kind, group): dim, group_size, calls, buffer_bytes, sent_bytes."""
        rows = []
        for (kind, name, size), calls in sorted(self.calls.items()):
            nb = self.buffer_bytes[(kind, name, size)]
            rows.append(
                {
                    "kind": kind,
                    "dim": dim_of_group.get(name, "other"),
                    "group_size": size,
                    "calls": calls,
                    "buffer_bytes": int(nb),
                    "sent_bytes": float(sent_bytes(kind, nb, size)),
                }
            )
        return rows


class PeakMemMeter(TorchDispatchMode):
    """Current and peak bytes of live tensor storages seen by this rank.

    Call :meth:`track` on tensors created before the mode was entered (parameters, inputs).
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[list[int], weakref.ref]] = {}
        self.cur_bytes = 0
        self.peak_bytes = 0
        self._orig_resize = None
        # debugging aid (HARNESS_MEM_DEBUG=1): the live storages by creating op and shape at
        # the peak, as {label: bytes}
        self.debug = bool(os.environ.get("HARNESS_MEM_DEBUG"))
        self._labels: dict[int, str] = {}
        self.peak_snapshot: dict[str, int] = {}
        self._label = "tracked"

    # --- bookkeeping -------------------------------------------------------------------------
    def _dec(self, key: int, rec: list[int]) -> None:
        self.cur_bytes -= rec[0]
        self._live.pop(key, None)

    def _add_storage(self, st: torch.UntypedStorage) -> None:
        key = id(st)
        if key in self._live and self._live[key][1]() is st:
            return
        rec = [st.nbytes()]
        try:
            ref = weakref.ref(st, lambda _r, key=key, rec=rec: self._dec(key, rec))
        except TypeError:
            return
        self._live[key] = (rec, ref)
        self.cur_bytes += rec[0]
        if self.debug:
            self._labels[key] = self._label
        self._bump()

    def _bump(self) -> None:
        if self.cur_bytes > self.peak_bytes:
            self.peak_bytes = self.cur_bytes
            if self.debug:
                snap: dict[str, int] = {}
                for k, (rec, _ref) in self._live.items():
                    lab = self._labels.get(k, "?")
                    snap[lab] = snap.get(lab, 0) + rec[0]
                self.peak_snapshot = snap

    def track(self, *objs) -> None:
        """Track the storages of every tensor (or DTensor's local tensor) in ``objs``."""
        self._label = "tracked"
        for t in tree_flatten(list(objs))[0]:
            if isinstance(t, torch.Tensor):
                t = getattr(t, "_local_tensor", t)
                if t.device.type != "meta":
                    self._add_storage(t.untyped_storage())

    def reset_peak(self) -> None:
        self.peak_bytes = self.cur_bytes
        self.peak_snapshot = {}

    # --- mode ---------------------------------------------------------------------------------
    def __enter__(self):
        meter = self
        orig = torch.UntypedStorage.resize_
        self._orig_resize = orig

        def resize_(st, size):  # FSDP2 frees / re-allocates unsharded params this way
            before = st.nbytes()
            out = orig(st, size)
            key = id(st)
            if key in meter._live and meter._live[key][1]() is st:
                rec = meter._live[key][0]
                meter.cur_bytes += st.nbytes() - before
                rec[0] = st.nbytes()
                meter._bump()
            else:
                meter._label = f"resize_ {size}"
                meter._add_storage(st)
            return out

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        if self._orig_resize is not None:
            torch.UntypedStorage.resize_ = self._orig_resize
            self._orig_resize = None
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(getattr(t, "__name__", "") == "DTensor" for t in types):
            return NotImplemented
        out = func(*args, **kwargs)
        if any(getattr(t, "__name__", "") == "FakeTensor" for t in types):
            return out
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                if self.debug:
                    self._label = f"{func.__name__} {tuple(t.shape)}"
                try:
                    self._add_storage(t.untyped_storage())
                except (RuntimeError, NotImplementedError):
                    pass
        return out
