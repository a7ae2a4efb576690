"""Discover an EFA device from Python, and turn its queue queries into the NIC layout.

Why: a prediction made on the emulated SRD NIC is confirmed only on EFA, and that
needs to know first what the device can do (capabilities, the doorbell batch, the
queue geometry the kernels must follow). :func:`discover` asks the device through
the ``efa`` package from PyPI (rdma4py: Cython bindings that dlopen libibverbs.so.1
and libefa.so.1 at import). Where something is missing it raises
:class:`~lever.sim.errors.UserError` with one line naming exactly what: the
libraries are looked up with ctypes first, so that check needs no extra package.

:func:`layout_from_query` turns ``QP.query_wqs()`` / ``CQ.query_efa()`` results (the
``efa`` package's ``WQAttr`` / ``CQAttr``: ``buffer_addr``, ``entry_size``,
``num_entries``, ``doorbell_addr``, ``max_batch``; checked against efa 2026.10.22)
into the fields of ``lever_efa_nic_layout`` (hw/efa/nic_layout.h), validated with the
same rules as ``lever_efa_layout_problem`` there. :class:`NicLayout` is the ctypes
mirror of that struct, for handing it to an extension.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lever.sim.errors import UserError

REQUIRED_RDMA_CORE = 59
"""rdma-core release that added efadv_query_qp_wqs / efadv_query_cq (EFA_1.4)."""
IBVERBS = "libibverbs.so.1"
LIBEFA = "libefa.so.1"
NEEDED_SYMBOLS = ("efadv_query_qp_wqs", "efadv_query_cq")

CAP_BITS = {  # efadv_device_attr.device_caps, EFADV_DEVICE_ATTR_CAPS_* (rdma-core v59)
    "rdma_read": 1 << 0,
    "rnr_retry": 1 << 1,
    "cq_with_sgid": 1 << 2,
    "rdma_write": 1 << 3,
    "unsolicited_write_recv": 1 << 4,
    "cq_with_ext_mem_dmabuf": 1 << 5,
    "comp_cntr": 1 << 6,  # completion counters (rdma-core after v64)
}
FEATURES = {
    # what rdma-core added after v59 that the kernels can use: the release, and the entry point
    # whose presence in the loaded library says it has it (libefa's; the counters need
    # libibverbs' ibv_qp_attach_comp_cntr too)
    "wqe128_inline_write": ("128-byte WQEs with inline writes", "63", ((LIBEFA, "efadv_get_max_sq_depth"),)),
    "comp_cntr": ("completion counters", "a release after 64",
                  ((LIBEFA, "efadv_create_comp_cntr"), (IBVERBS, "ibv_qp_attach_comp_cntr"))),
}
# ibv_qp_create_send_ops_flags (IBV_QP_EX_WITH_*), as the efa package's QPExSendOpsFlags
_OPS_RDMA_WRITE, _OPS_RDMA_WRITE_WITH_IMM, _OPS_SEND, _OPS_SEND_WITH_IMM, _OPS_RDMA_READ = (
    1 << 0, 1 << 1, 1 << 2, 1 << 3, 1 << 4)

# nic_layout.h constants
LAYOUT_VERSION = 2
LAYOUT_BYTES = 200
INLINE_WRITE_MAX = 80
"""Payload bytes beside the descriptor of a 128-byte WQE's RDMA write (v63 efa_io_rdma_req_128)."""
MEM = {"none": 0, "device_bar": 1, "host": 2, "host_only": 3, "gpu": 4}
"""LEVER_EFA_MEM_*: where a region lives, and so how the GPU reaches it."""
SQ_PHASE_FIRST_LAP = 0
CQ_PHASE_FIRST_LAP = 1
WQE_SIZES = (64, 128)
CQE_SIZES = (16, 32, 64)
MAX_RING_ENTRIES = 65536
_ALIASES = {"buffer_addr": "buffer", "doorbell_addr": "doorbell"}  # rdma-core's efadv names


class LayoutError(UserError):
    """A queue query result that the kernels can not use; ``str()`` is one line."""


# ----------------------------------------------------------------- library checks
def _load_library(soname: str) -> Any | None:
    """The loaded library (a ctypes.CDLL), or None when the dynamic loader can't find it."""
    try:
        return ctypes.CDLL(soname)
    except OSError:
        pass
    found = ctypes.util.find_library(soname[3:].split(".so")[0])  # "ibverbs", "efa"
    if found and found != soname:
        try:
            return ctypes.CDLL(found)
        except OSError:
            return None
    return None


def _has_symbol(lib: Any, name: str) -> bool:
    try:
        getattr(lib, name)
    except AttributeError:
        return False
    return True


def _rdma_core_version(soname: str, maps: str | None = None) -> int | None:
    """rdma-core's release from the file the loader mapped for ``soname``.

    rdma-core names its libraries ``<soname>.<abi>.<release>.0`` (libefa.so.1.4.59.0,
    Debian 12: libefa.so.1.3.44.0), so the release is in the file name. ``maps`` is
    the text of /proc/self/maps (read when not given).
    """
    stem = soname.split(".so")[0] + ".so."
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return None
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)  # address perms offset dev inode [path]
        path = parts[5] if len(parts) == 6 else ""
        if os.path.basename(path).startswith(stem):
            m = re.search(r"\.so\.\d+\.\d+\.(\d+)\.\d+$", os.path.realpath(path))
            if m:
                return int(m.group(1))
    return None


def loaded_path(soname: str, maps: str | None = None) -> str | None:
    """The file the dynamic loader mapped for ``soname`` (resolved), from /proc/self/maps:
    what the EFA extension links with, so it runs against the library discovery checked."""
    stem = soname.split(".so")[0] + ".so."
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return None
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        path = parts[5] if len(parts) == 6 else ""
        if os.path.basename(path).startswith(stem):
            return os.path.realpath(path)
    return None


def check_libraries() -> dict[str, Any]:
    """libibverbs, libefa and a new enough rdma-core, or a one-line UserError."""
    if _load_library(IBVERBS) is None:
        raise UserError(f"no EFA device: {IBVERBS} not found")
    efa_lib = _load_library(LIBEFA)
    if efa_lib is None:
        raise UserError(f"no EFA device: {LIBEFA} not found (rdma-core's EFA provider)")
    version = _rdma_core_version(LIBEFA)
    for sym in NEEDED_SYMBOLS:
        if not _has_symbol(efa_lib, sym):
            if version is not None:
                raise UserError(f"rdma-core {version} is too old for {sym} "
                                f"(needs {REQUIRED_RDMA_CORE})")
            raise UserError(f"rdma-core is too old for {sym}: {LIBEFA} lacks it "
                            f"(needs {REQUIRED_RDMA_CORE})")
    return {"libibverbs": IBVERBS, "libefa": LIBEFA, "rdma_core": version,
            "paths": {so: loaded_path(so) for so in (IBVERBS, LIBEFA)}}


def lib_features(libs: Mapping[str, Any] | None = None) -> dict[str, bool]:
    """Which of :data:`FEATURES` the loaded libibverbs/libefa export (``libs``: soname ->
    library, default: loaded here)."""
    libs = dict(libs) if libs is not None else {so: _load_library(so) for so in (IBVERBS, LIBEFA)}
    return {name: all(libs.get(so) is not None and _has_symbol(libs[so], sym) for so, sym in syms)
            for name, (_, _, syms) in FEATURES.items()}


def require_features(*, inline_write: bool = False, counters: bool = False,
                     libs: Mapping[str, Any] | None = None, version: int | None = None) -> None:
    """The loaded rdma-core has what a run asks beyond v59, or a one-line UserError naming the
    release it needs: 128-byte WQEs with inline writes (v63), completion counters (after v64)."""
    if not (inline_write or counters):
        return
    if libs is None:
        libs = {so: _load_library(so) for so in (IBVERBS, LIBEFA)}
        version = _rdma_core_version(LIBEFA) if version is None else version
    for name, asked in (("wqe128_inline_write", inline_write), ("comp_cntr", counters)):
        if not asked:
            continue
        what, needs, syms = FEATURES[name]
        for so, sym in syms:
            lib = libs.get(so)
            if lib is None or not _has_symbol(lib, sym):
                rel = f"rdma-core {version}" if version is not None else "rdma-core"
                raise UserError(f"{rel} is too old for {what}: {so} lacks {sym} (needs {needs})")


def require_device(info: Mapping[str, Any], *, inline_write: bool = False, counters: bool = False) -> None:
    """The device (a :func:`discover` result or the binding's caps) can do what a run asks, or
    a one-line UserError: inline writes need RDMA write, counters the COMP_CNTR cap."""
    caps = int(info.get("device_caps", 0))
    name = info.get("device") or info.get("device_name") or "?"
    if inline_write and not caps & CAP_BITS["rdma_write"]:
        raise UserError(f"EFA device {name} lacks RDMA write (device_caps {caps:#x}): no inline writes")
    if counters and not caps & CAP_BITS["comp_cntr"]:
        raise UserError(f"EFA device {name} has no completion counters (device_caps {caps:#x} lacks COMP_CNTR)")


def _import_efa() -> Any:
    """The ``efa`` package, or a one-line UserError saying why it can't be used."""
    try:
        import efa  # type: ignore[import-not-found]
    except ModuleNotFoundError as e:
        if e.name == "efa":
            raise UserError("no EFA device: the efa package is not installed (pip install efa)") from None
        raise UserError(f"no EFA device: the efa package failed to import: {_one_line(e)}") from None
    except ImportError as e:
        raise UserError(f"no EFA device: the efa package failed to import: {_one_line(e)}") from None
    return efa


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


# ----------------------------------------------------------------- discovery
def discover(device: str | None = None, port: int = 1, probe: bool = True) -> dict[str, Any]:
    """What the EFA device can do, as a JSON-ready dict.

    ``device`` picks one by name (default: the first device of the EFA provider).
    ``probe`` creates a small SRD QP and CQ, reads back their layout
    (efadv_query_qp_wqs / efadv_query_cq: the only place v59 reports the device's
    doorbell batch, ``max_tx_batch``) and destroys them again.
    Raises UserError (one line) when a library, the package or the device is missing.
    """
    libs = check_libraries()
    efa = _import_efa()
    err_types = tuple(t for t in (getattr(efa, "EfaError", None), OSError, RuntimeError) if t)
    try:
        all_devs = list(efa.get_device_list())
        efa_devs = list(efa.get_efa_device_list()) if all_devs else []
    except err_types as e:
        raise UserError(f"no EFA device: listing ibv devices failed: {_one_line(e)}") from None
    if not all_devs:
        raise UserError("no EFA device: no ibv device (libibverbs lists none; is "
                        "/dev/infiniband/uverbs* visible here?)")
    if not efa_devs:
        names = ", ".join(d.name for d in all_devs)
        raise UserError(f"no EFA device: no ibv device of the EFA provider (found: {names})")
    if device is not None:
        chosen = [d for d in efa_devs if d.name == device]
        if not chosen:
            names = ", ".join(d.name for d in efa_devs)
            raise UserError(f"no EFA device named {device} (EFA devices: {names})")
        dev = chosen[0]
    else:
        dev = efa_devs[0]

    try:
        ctx = dev.open()
    except err_types as e:
        raise UserError(f"EFA device {dev.name}: can not open it: {_one_line(e)}") from None
    try:
        ea = ctx.query_efa_device()
        da = ctx.query_device()
        pa = ctx.query_port(port)
        gid = bytes(ctx.query_gid(port, 0))
        probed = _probe(efa, ctx, ea.device_caps) if probe else None
    except LayoutError as e:
        raise LayoutError(f"EFA device {dev.name}: probe QP layout unusable: {e}") from None
    except err_types as e:
        raise UserError(f"EFA device {dev.name}: {_one_line(e)}") from None
    finally:
        ctx.close()

    caps = {name: bool(ea.device_caps & bit) for name, bit in CAP_BITS.items()}
    out: dict[str, Any] = {
        "device": dev.name,
        "guid": f"0x{int(getattr(dev, 'guid', 0)):016x}",
        "gid": gid.hex(),
        "port": port,
        "rdma_core": libs["rdma_core"],
        "efa_package": str(getattr(efa, "__version__", "")),
        # efadv_query_device
        "max_sq_wr": int(ea.max_sq_wr),
        "max_rq_wr": int(ea.max_rq_wr),
        "max_sq_sge": int(ea.max_sq_sge),
        "max_rq_sge": int(ea.max_rq_sge),
        "inline_buf_size": int(ea.inline_buf_size),
        # v63: the inline size that counts (absent from older packages and libraries: 0)
        "inline_buf_size_ex": int(getattr(ea, "inline_buf_size_ex", 0) or 0),
        "device_caps": int(ea.device_caps),
        "max_rdma_size": int(ea.max_rdma_size),
        "caps": caps,
        # what the loaded rdma-core can do beyond v59 (128-byte WQEs with inline writes: v63;
        # completion counters: after v64), and so what a run on this machine may ask
        "lib_features": lib_features(),
        "inline_write_size": inline_write_size(int(ea.inline_buf_size),
                                               int(getattr(ea, "inline_buf_size_ex", 0) or 0)),
        "max_tx_batch": probed["layout"]["sq_max_batch"] if probed else None,
        "device_attr": {k: _plain(getattr(da, k, None)) for k in (
            "fw_ver", "vendor_id", "vendor_part_id", "hw_ver", "max_qp", "max_qp_wr", "max_cq",
            "max_cqe", "max_mr", "max_mr_size", "max_pd", "max_ah")},
        "port_attr": {k: _plain(getattr(pa, k, None)) for k in (
            "state", "active_mtu", "max_mtu", "max_msg_sz", "link_layer")},
    }
    if probed:
        out["probe"] = probed
    return out


def inline_write_size(inline_buf_size: int, inline_buf_size_ex: int = 0) -> int:
    """Payload bytes an RDMA write may carry inline on a QP made with the inline-write flag
    (v63): the device's inline size (the extended one where reported), at most the 80 bytes
    beside a 128-byte WQE's descriptor."""
    return min(inline_buf_size_ex or inline_buf_size, INLINE_WRITE_MAX)


def _plain(v: Any) -> Any:
    return v if v is None or isinstance(v, str | bool) else int(v)


def _probe(efa: Any, ctx: Any, device_caps: int) -> dict[str, Any]:
    """A small SRD QP + CQ: their queried layout, then destroyed in reverse order."""
    ops = _OPS_SEND | _OPS_SEND_WITH_IMM
    if device_caps & CAP_BITS["rdma_write"]:
        ops |= _OPS_RDMA_WRITE | _OPS_RDMA_WRITE_WITH_IMM
    if device_caps & CAP_BITS["rdma_read"]:
        ops |= _OPS_RDMA_READ
    made: list[Any] = []
    try:
        pd = ctx.alloc_pd()
        made.append(pd)
        cq = ctx.create_cq(64)
        made.append(cq)
        qp = pd.create_qp(efa.QPInitAttr(send_cq=cq, recv_cq=cq, max_send_wr=64, max_recv_wr=1,
                                         send_ops_flags=ops))
        made.append(qp)
        sq_attr, rq_attr = qp.query_wqs()
        cq_attr = cq.query_efa()
        wqs = {"sq": attrs_to_dict(sq_attr), "rq": attrs_to_dict(rq_attr)}
        cqd = attrs_to_dict(cq_attr)
        layout = layout_from_query(wqs, cqd, qp_num=int(qp.qp_num), device_caps=device_caps)
        return {"wqs": wqs, "cq": cqd, "layout": layout}
    finally:
        for obj in reversed(made):
            obj.close()


WQ_FIELDS = ("buffer_addr", "entry_size", "num_entries", "doorbell_addr", "max_batch")
CQ_FIELDS = ("buffer_addr", "entry_size", "num_entries", "doorbell_addr")


def attrs_to_dict(obj: Any) -> dict[str, int]:
    """A ``WQAttr`` / ``CQAttr`` of the efa package as the dict recorded in JSON."""
    names = WQ_FIELDS if hasattr(obj, "max_batch") else CQ_FIELDS
    return {k: int(getattr(obj, k, 0) or 0) for k in names}


def record_platform(info: Mapping[str, Any]) -> dict[str, str]:
    """``what.platform`` fields of a run record (calibration/records.py PlatformInfo) for a
    run on this device: the NIC named with what it can do."""
    from lever.calibration.records import PlatformInfo

    on = [k for k, v in info.get("caps", {}).items() if v]
    nic = (f"EFA {info.get('device', '?')} (rdma-core {info.get('rdma_core') or '?'}; "
           f"caps {'+'.join(on) or 'none'}; max_tx_batch {info.get('max_tx_batch') or '?'}; "
           f"max_rdma_size {info.get('max_rdma_size', '?')}; inline {info.get('inline_buf_size', '?')}"
           f"{_generation(info)})")
    return PlatformInfo(nic=nic).model_dump(include={"nic"})


def _generation(info: Mapping[str, Any]) -> str:
    """The newer features a record's nic line names: what the library and device have."""
    lib = info.get("lib_features") or {}
    out = ""
    if lib.get("wqe128_inline_write"):
        out += f"; 128-byte WQEs, inline write {info.get('inline_write_size', '?')}"
    if lib.get("comp_cntr") and (info.get("caps") or {}).get("comp_cntr"):
        out += "; completion counters"
    return out


def capability_report(info: Mapping[str, Any]) -> dict[str, Any]:
    """What ``lever hw efa-info --out`` writes: the capabilities and the record fields a
    run on this device carries (``nic`` and ``what.platform``)."""
    return {
        "kind": "lever-efa-info",
        "version": 1,
        "capabilities": dict(info),
        "record": {"nic": "efa", "what": {"platform": record_platform(info)}},
    }


# ----------------------------------------------------------------- layout
def _get(obj: Any, name: str, where: str) -> int:
    if isinstance(obj, Mapping):
        if name in obj:
            v = obj[name]
        elif _ALIASES.get(name) in obj:
            v = obj[_ALIASES[name]]
        else:
            raise LayoutError(f"{where}: no field '{name}' (want the efa package's "
                              f"{'WQAttr' if where == 'sq' else 'CQAttr'} fields)")
    else:
        if not hasattr(obj, name):
            raise LayoutError(f"{where}: no attribute '{name}'")
        v = getattr(obj, name)
    if isinstance(v, str):
        try:
            v = int(v, 0)
        except ValueError:
            raise LayoutError(f"{where}.{name}: {v!r} is not an integer") from None
    if isinstance(v, bool) or not isinstance(v, int):
        raise LayoutError(f"{where}.{name}: {v!r} is not an integer")
    if not 0 <= v < 1 << 64:
        raise LayoutError(f"{where}.{name}: {v} is outside [0, 2^64)")
    return v


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _sq_of(wqs: Any) -> Any:
    """The SQ part of a query_wqs result: (sq, rq) as the package returns it, or
    {"sq": ..., "rq": ...} as recorded, or the SQ attributes themselves."""
    if isinstance(wqs, Mapping):
        return wqs["sq"] if "sq" in wqs else wqs
    if isinstance(wqs, list | tuple):
        if len(wqs) != 2:
            raise LayoutError(f"wqs: a query_wqs result is (sq, rq), got {len(wqs)} items")
        return wqs[0]
    return wqs


def layout_from_query(wqs: Any, cq: Any, *, qp_num: int = 0, qkey: int = 0, lkey: int = 0,
                      local_addr: int = 0, inline_buf_size: int = 0, max_rdma_size: int = 0,
                      device_caps: int = 0, sq_buffer_mem: str = "device_bar",
                      sq_doorbell_mem: str = "device_bar", cq_buffer_mem: str = "host",
                      sq_buffer_dev: int = 0, sq_doorbell_dev: int = 0, cq_buffer_dev: int = 0,
                      peers: int = 0, num_peers: int = 0, peers_mem: str = "none",
                      inline_write_size: int = 0, cntr_mem: str = "none", send_cntr: int = 0,
                      send_cntr_dev: int = 0, send_err_cntr_dev: int = 0, rwrite_cntr: int = 0,
                      rwrite_cntr_dev: int = 0) -> dict[str, int]:
    """``lever_efa_nic_layout`` fields (hw/efa/nic_layout.h) from a queue query, validated.

    ``wqs`` is ``QP.query_wqs()`` ((sq, rq) ``WQAttr``) or its recorded dict; ``cq`` is
    ``CQ.query_efa()`` (``CQAttr``) or its dict. The ``*_dev`` addresses are 0 until the
    binding maps the regions for the GPU. The provider's "no batch limit" max_batch
    (UINT16_MAX on v59 when the device reports no max_tx_batch) is bounded by the ring.
    Raises :class:`LayoutError` (one line naming the field) for a value the kernels
    could not use: null or misaligned addresses, WQE sizes other than 64/128, CQ entry
    sizes other than 16/32/64, rings that are not a power of two up to 65536, inline
    writes without 128-byte WQEs or above their 80 bytes, a send counter without its error
    count or not 8-byte aligned.

    ``inline_write_size`` (v63, a QP made with the inline-write flag: :func:`inline_write_size`)
    and the completion counters (after v64: where their 64-bit counts are, host VA and GPU
    address, ``cntr_mem`` where they live) are the layout's version-2 fields.
    """
    sq = _sq_of(wqs)
    sq_buf = _get(sq, "buffer_addr", "sq")
    sq_db = _get(sq, "doorbell_addr", "sq")
    sq_es = _get(sq, "entry_size", "sq")
    sq_n = _get(sq, "num_entries", "sq")
    sq_mb = _get(sq, "max_batch", "sq")
    cq_buf = _get(cq, "buffer_addr", "cq")
    cq_es = _get(cq, "entry_size", "cq")
    cq_n = _get(cq, "num_entries", "cq")

    if sq_buf == 0:
        raise LayoutError("sq.buffer_addr: null (no LLQ descriptor ring)")
    if sq_db == 0:
        raise LayoutError("sq.doorbell_addr: null (no SQ doorbell)")
    if sq_buf % 64:
        raise LayoutError(f"sq.buffer_addr: {sq_buf:#x} is not 64-byte aligned")
    if sq_db % 4:
        raise LayoutError(f"sq.doorbell_addr: {sq_db:#x} is not 4-byte aligned")
    if sq_es not in WQE_SIZES:
        raise LayoutError(f"sq.entry_size: {sq_es} is not 64 or 128 bytes")
    if not _pow2(sq_n) or not 2 <= sq_n <= MAX_RING_ENTRIES:
        raise LayoutError(f"sq.num_entries: {sq_n} is not a power of two in [2, {MAX_RING_ENTRIES}]")
    if sq_mb == 0:
        raise LayoutError("sq.max_batch: 0 (a doorbell must cover at least one WQE)")
    if cq_buf == 0:
        raise LayoutError("cq.buffer_addr: null (no CQ ring)")
    if cq_buf % 16:
        raise LayoutError(f"cq.buffer_addr: {cq_buf:#x} is not 16-byte aligned")
    if cq_es not in CQE_SIZES:
        raise LayoutError(f"cq.entry_size: {cq_es} is not 16, 32 or 64 bytes")
    if not _pow2(cq_n) or cq_n > MAX_RING_ENTRIES:
        raise LayoutError(f"cq.num_entries: {cq_n} is not a power of two in [1, {MAX_RING_ENTRIES}]")
    if not 0 <= qp_num <= 0xFFFF:
        raise LayoutError(f"qp_num: {qp_num:#x} does not fit the WQE's 16-bit dest_qp_num")
    if not 0 <= lkey <= 0xFFFFFF:
        raise LayoutError(f"lkey: {lkey:#x} does not fit the WQE's 24-bit lkey")
    for name, kind in (("sq_buffer_mem", sq_buffer_mem), ("sq_doorbell_mem", sq_doorbell_mem),
                       ("cq_buffer_mem", cq_buffer_mem), ("peers_mem", peers_mem)):
        if kind not in MEM:
            raise LayoutError(f"{name}: {kind!r} is not one of {', '.join(MEM)}")
    if cntr_mem not in MEM:
        raise LayoutError(f"cntr_mem: {cntr_mem!r} is not one of {', '.join(MEM)}")
    if not 0 <= inline_write_size <= INLINE_WRITE_MAX:
        raise LayoutError(f"inline_write_size: {inline_write_size} is outside [0, {INLINE_WRITE_MAX}] "
                          "(the payload beside a 128-byte WQE's descriptor)")
    if inline_write_size and sq_es != 128:
        raise LayoutError(f"inline_write_size: {inline_write_size} with {sq_es}-byte WQEs (inline RDMA "
                          "writes need the 128-byte WQEs of a QP made with the inline-write flag)")
    if (send_cntr_dev or rwrite_cntr_dev) and cntr_mem not in ("gpu", "host"):
        raise LayoutError(f"cntr_mem: {cntr_mem!r}, but a counter is mapped for the GPU (gpu or host)")
    if send_cntr_dev and (not send_err_cntr_dev or (send_cntr_dev | send_err_cntr_dev) % 8):
        raise LayoutError("send_cntr_dev: needs send_err_cntr_dev beside it, both 8-byte aligned")
    gpu_cq = cq_buffer_mem == "gpu"
    return {
        "version": LAYOUT_VERSION,
        "qp_num": qp_num,
        "sq_buffer": sq_buf,
        "sq_buffer_dev": sq_buffer_dev,
        "sq_doorbell": sq_db,
        "sq_doorbell_dev": sq_doorbell_dev,
        "sq_entry_size": sq_es,
        "sq_num_entries": sq_n,
        "sq_max_batch": min(sq_mb, sq_n),
        "sq_buffer_mem": MEM[sq_buffer_mem],
        "sq_doorbell_mem": MEM[sq_doorbell_mem],
        "sq_phase_first": SQ_PHASE_FIRST_LAP,
        "cq_buffer": 0 if gpu_cq else cq_buf,
        "cq_buffer_dev": cq_buf if gpu_cq else cq_buffer_dev,
        "cq_doorbell": _get(cq, "doorbell_addr", "cq") if _has(cq, "doorbell_addr") else 0,
        "cq_entry_size": cq_es,
        "cq_num_entries": cq_n,
        "cq_buffer_mem": MEM[cq_buffer_mem],
        "cq_phase_first": CQ_PHASE_FIRST_LAP,
        "qkey": qkey,
        "lkey": lkey,
        "local_addr": local_addr,
        "inline_buf_size": inline_buf_size,
        "max_rdma_size": max_rdma_size,
        "device_caps": device_caps,
        "num_peers": num_peers,
        "peers": peers,
        "peers_mem": MEM[peers_mem],
        "reserved": 0,
        "inline_write_size": inline_write_size,
        "cntr_mem": MEM[cntr_mem],
        "send_cntr": send_cntr,
        "send_cntr_dev": send_cntr_dev,
        "send_err_cntr_dev": send_err_cntr_dev,
        "rwrite_cntr": rwrite_cntr,
        "rwrite_cntr_dev": rwrite_cntr_dev,
    }


def _has(obj: Any, name: str) -> bool:
    if isinstance(obj, Mapping):
        return name in obj or _ALIASES.get(name) in obj
    return hasattr(obj, name)


class NicLayout(ctypes.Structure):
    """ctypes mirror of ``lever_efa_nic_layout`` (200 bytes, version 2; tests compare the
    offsets with the C compiler's)."""

    _fields_ = [
        ("version", ctypes.c_uint32), ("qp_num", ctypes.c_uint32),
        ("sq_buffer", ctypes.c_uint64), ("sq_buffer_dev", ctypes.c_uint64),
        ("sq_doorbell", ctypes.c_uint64), ("sq_doorbell_dev", ctypes.c_uint64),
        ("sq_entry_size", ctypes.c_uint32), ("sq_num_entries", ctypes.c_uint32),
        ("sq_max_batch", ctypes.c_uint32), ("sq_buffer_mem", ctypes.c_uint32),
        ("sq_doorbell_mem", ctypes.c_uint32), ("sq_phase_first", ctypes.c_uint32),
        ("cq_buffer", ctypes.c_uint64), ("cq_buffer_dev", ctypes.c_uint64),
        ("cq_doorbell", ctypes.c_uint64),
        ("cq_entry_size", ctypes.c_uint32), ("cq_num_entries", ctypes.c_uint32),
        ("cq_buffer_mem", ctypes.c_uint32), ("cq_phase_first", ctypes.c_uint32),
        ("qkey", ctypes.c_uint32), ("lkey", ctypes.c_uint32), ("local_addr", ctypes.c_uint64),
        ("inline_buf_size", ctypes.c_uint32), ("max_rdma_size", ctypes.c_uint32),
        ("device_caps", ctypes.c_uint32), ("num_peers", ctypes.c_uint32),
        ("peers", ctypes.c_uint64), ("peers_mem", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
        ("inline_write_size", ctypes.c_uint32), ("cntr_mem", ctypes.c_uint32),
        ("send_cntr", ctypes.c_uint64), ("send_cntr_dev", ctypes.c_uint64),
        ("send_err_cntr_dev", ctypes.c_uint64), ("rwrite_cntr", ctypes.c_uint64),
        ("rwrite_cntr_dev", ctypes.c_uint64),
    ]


def pack_layout(layout: Mapping[str, int]) -> bytes:
    """The 200 bytes of ``lever_efa_nic_layout`` for a layout dict (every field required)."""
    names = [f[0] for f in NicLayout._fields_]
    missing = [n for n in names if n not in layout]
    if missing:
        raise LayoutError(f"layout: missing field {missing[0]}")
    return bytes(NicLayout(**{n: int(layout[n]) for n in names}))


class NicPeer(ctypes.Structure):
    """ctypes mirror of ``lever_efa_peer`` (24 bytes): what a WQE needs to reach one peer queue."""

    _fields_ = [
        ("ahn", ctypes.c_uint16), ("remote_qpn", ctypes.c_uint16),
        ("remote_qkey", ctypes.c_uint32), ("rkey", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32), ("remote_addr", ctypes.c_uint64),
    ]


def pack_peers(peers: list[Mapping[str, int]]) -> bytes:
    """The bytes of a ``lever_efa_peer`` table ([num_ranks][receive queues], row-major): what
    a rank learns from every peer over torch.distributed (AH number from efadv_query_ah on
    the peer's GID, the peer QP's number and qkey, its window's rkey and base address)."""
    out = bytearray()
    for i, p in enumerate(peers):
        for k, bits in (("ahn", 16), ("remote_qpn", 16), ("remote_qkey", 32), ("rkey", 32)):
            if not 0 <= int(p[k]) < 1 << bits:
                raise LayoutError(f"peer {i}: {k} {p[k]:#x} does not fit {bits} bits")
        out += bytes(NicPeer(ahn=p["ahn"], remote_qpn=p["remote_qpn"], remote_qkey=p["remote_qkey"],
                             rkey=p["rkey"], reserved=0, remote_addr=int(p.get("remote_addr", 0))))
    return bytes(out)
