"""gpu-check's kernels as PTX text, compiled for the device at run time by the driver's JIT.

Each writes a result whose value is known exactly in advance (small whole numbers in fp32).
So a wrong result fails the trial; each kernel's generator says what it computes."""

from __future__ import annotations

import struct

HEADER = ".version 6.0\n.target sm_50\n.address_size 64\n"
MMA_HEADER = ".version 7.0\n.target sm_80\n.address_size 64\n"
CHAINS, UNROLL = 8, 16  # fma: independent chains per thread, FMAs per chain per loop turn
MMA_CHAINS, MMA_UNROLL = 8, 4  # mma: independent accumulators per warp, instructions per accumulator per turn
MMA_FLOPS = 2 * 16 * 8 * 16  # one m16n8k16 instruction of one warp


def fma_sum(iters: int) -> float:
    """What every thread of `fma` stores."""
    return float(sum(range(CHAINS)) + CHAINS * UNROLL * iters)


def mma_sum(iters: int) -> float:
    """What every thread of `mma` stores: 4 registers per accumulator, each k + 16 per instruction."""
    return float(4 * sum(range(MMA_CHAINS)) + 4 * MMA_CHAINS * 16 * MMA_UNROLL * iters)


def fma_flops(iters: int) -> int:
    """Floating-point operations of one thread of `fma` (an FMA is two)."""
    return 2 * CHAINS * UNROLL * iters


def mma_flops(iters: int) -> int:
    """Floating-point operations of one warp of `mma`."""
    return MMA_FLOPS * MMA_CHAINS * MMA_UNROLL * iters


def _f32(value: float) -> str:
    """An fp32 immediate as PTX writes it exactly: 0f and the eight hex digits of its bits."""
    return "0f" + struct.pack(">f", value).hex().upper()


def _store_sum(regs: list[str]) -> str:
    """Sum `regs` into %s and store it at out[global thread index]."""
    lines = [f"    mov.f32 %s, {regs[0]};"] + [f"    add.f32 %s, %s, {r};" for r in regs[1:]]
    return "\n".join(lines) + """
    mov.u32 %t0, %tid.x;
    mov.u32 %t1, %ntid.x;
    mov.u32 %t2, %ctaid.x;
    mad.lo.u32 %t0, %t2, %t1, %t0;
    ld.param.u64 %out, [out];
    cvta.to.global.u64 %out, %out;
    mul.wide.u32 %off, %t0, 4;
    add.u64 %out, %out, %off;
    st.global.f32 [%out], %s;
    ret;
}
"""


def basic() -> str:
    """The module every GPU loads: gpuvs_empty, gpuvs_fma and gpuvs_copy."""
    return HEADER + _empty() + _fma() + _copy()


def tensor() -> str:
    """The tensor-core module (sm_80 and newer): gpuvs_mma."""
    return MMA_HEADER + _mma()


def _empty() -> str:
    """gpuvs_empty: nothing; the launch itself (launch latency)."""
    return ".visible .entry gpuvs_empty()\n{\n    ret;\n}\n"


def _fma() -> str:
    """gpuvs_fma: CHAINS independent fp32 FMA chains per thread, UNROLL deep per loop turn, x = x * a + b.

    a = b = 1 come from the kernel's parameters, so the compiler can fold nothing. Chain k starts at k, so no two
    chains are the same expression, and ends at k + UNROLL * iters; each thread stores its chains' sum."""
    x = [f"%x{k}" for k in range(CHAINS)]
    body = "\n".join(f"    fma.rn.f32 {r}, {r}, %a, %b;" for _ in range(UNROLL) for r in x)
    init = "\n".join(f"    mov.f32 {r}, {_f32(k)};" for k, r in enumerate(x))
    return f""".visible .entry gpuvs_fma(.param .u64 out, .param .f32 pa, .param .f32 pb, .param .u32 iters)
{{
    .reg .f32 %x<{CHAINS}>;
    .reg .f32 %a, %b, %s;
    .reg .u32 %i, %n, %t0, %t1, %t2;
    .reg .u64 %out, %off;
    .reg .pred %more;
    ld.param.f32 %a, [pa];
    ld.param.f32 %b, [pb];
    ld.param.u32 %n, [iters];
{init}
    mov.u32 %i, 0;
LOOP:
{body}
    add.u32 %i, %i, 1;
    setp.lt.u32 %more, %i, %n;
    @%more bra LOOP;
""" + _store_sum(x)


def _mma() -> str:
    """gpuvs_mma: tensor cores (sm_80+), MMA_CHAINS independent m16n8k16 accumulators per warp.

    A and B hold 1.0 (fp16, from the parameters) in every element, so every element of D gains 16 per instruction.
    Each thread stores the sum of its accumulator registers."""
    c = [[f"%c{4 * k + j}" for j in range(4)] for k in range(MMA_CHAINS)]
    one = ("    mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{d}}}, {{%a0, %a1, %a2, %a3}}, {{%b0, %b1}}, "
           "{{{d}}};")
    body = "\n".join(one.format(d=", ".join(regs)) for _ in range(MMA_UNROLL) for regs in c)
    init = "\n".join(f"    mov.f32 {r}, {_f32(k)};" for k, regs in enumerate(c) for r in regs)
    flat = [r for regs in c for r in regs]
    return f""".visible .entry gpuvs_mma(.param .u64 out, .param .b32 pa, .param .b32 pb, .param .u32 iters)
{{
    .reg .f32 %c<{4 * MMA_CHAINS}>;
    .reg .f32 %s;
    .reg .b32 %a<4>;
    .reg .b32 %b<2>;
    .reg .b32 %va, %vb;
    .reg .u32 %i, %n, %t0, %t1, %t2;
    .reg .u64 %out, %off;
    .reg .pred %more;
    ld.param.b32 %va, [pa];
    ld.param.b32 %vb, [pb];
    ld.param.u32 %n, [iters];
    mov.b32 %a0, %va;
    mov.b32 %a1, %va;
    mov.b32 %a2, %va;
    mov.b32 %a3, %va;
    mov.b32 %b0, %vb;
    mov.b32 %b1, %vb;
{init}
    mov.u32 %i, 0;
LOOP:
{body}
    add.u32 %i, %i, 1;
    setp.lt.u32 %more, %i, %n;
    @%more bra LOOP;
""" + _store_sum(flat)


def _copy() -> str:
    """gpuvs_copy: dst[i] = src[i] over 16-byte vectors, a grid-stride loop four vectors deep."""
    return """.visible .entry gpuvs_copy(.param .u64 dst, .param .u64 src, .param .u64 n)
{
    .reg .u64 %d, %s, %n, %i, %st, %st2, %st3, %st4, %j, %off, %p0, %p1, %p2, %p3, %q0, %q1, %q2, %q3, %t;
    .reg .u32 %bx, %bdim, %tx, %gdim;
    .reg .b32 %v<16>;
    .reg .pred %stop;
    ld.param.u64 %d, [dst];
    ld.param.u64 %s, [src];
    ld.param.u64 %n, [n];
    cvta.to.global.u64 %d, %d;
    cvta.to.global.u64 %s, %s;
    mov.u32 %bx, %ctaid.x;
    mov.u32 %bdim, %ntid.x;
    mov.u32 %tx, %tid.x;
    mov.u32 %gdim, %nctaid.x;
    mul.wide.u32 %i, %bx, %bdim;
    cvt.u64.u32 %t, %tx;
    add.u64 %i, %i, %t;
    mul.wide.u32 %st, %gdim, %bdim;
    shl.b64 %st2, %st, 1;
    add.u64 %st3, %st2, %st;
    shl.b64 %st4, %st, 2;
MAIN:
    add.u64 %j, %i, %st3;
    setp.ge.u64 %stop, %j, %n;
    @%stop bra TAIL;
    shl.b64 %off, %i, 4;
    add.u64 %p0, %s, %off;
    shl.b64 %t, %st, 4;
    add.u64 %p1, %p0, %t;
    add.u64 %p2, %p1, %t;
    add.u64 %p3, %p2, %t;
    ld.global.v4.b32 {%v0, %v1, %v2, %v3}, [%p0];
    ld.global.v4.b32 {%v4, %v5, %v6, %v7}, [%p1];
    ld.global.v4.b32 {%v8, %v9, %v10, %v11}, [%p2];
    ld.global.v4.b32 {%v12, %v13, %v14, %v15}, [%p3];
    add.u64 %q0, %d, %off;
    add.u64 %q1, %q0, %t;
    add.u64 %q2, %q1, %t;
    add.u64 %q3, %q2, %t;
    st.global.v4.b32 [%q0], {%v0, %v1, %v2, %v3};
    st.global.v4.b32 [%q1], {%v4, %v5, %v6, %v7};
    st.global.v4.b32 [%q2], {%v8, %v9, %v10, %v11};
    st.global.v4.b32 [%q3], {%v12, %v13, %v14, %v15};
    add.u64 %i, %i, %st4;
    bra MAIN;
TAIL:
    setp.ge.u64 %stop, %i, %n;
    @%stop bra DONE;
    shl.b64 %off, %i, 4;
    add.u64 %p0, %s, %off;
    add.u64 %q0, %d, %off;
    ld.global.v4.b32 {%v0, %v1, %v2, %v3}, [%p0];
    st.global.v4.b32 [%q0], {%v0, %v1, %v2, %v3};
    add.u64 %i, %i, %st;
    bra TAIL;
DONE:
    ret;
}
"""
