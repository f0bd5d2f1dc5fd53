"""Differential testing: random VALID graphs, compiled vs interpreted, must agree over 3 steps.

`gen_program(rnd)` writes a random program over a fixed set of declarations (f32/i32 tensors
of small shapes, bool and f32 scalars, a @fixed table, a growable table, an auto_dim tensor,
a plain persistent tensor, a persistent counter) with: elementwise / broadcast / matmul /
reduction / comparison ops, variable-valued attributes, nested loops (literal bounds, a
persistent counter bound, a truncated f32 dynamic bound), `return` inside loop bodies,
conditional and unconditional branches on computed conditions (call-and-return blocks that
branch further), cache reads (single, slices with negative ends), writes, resets, barriers,
deps, and a yield/await window with a mutating consumer and a reading consumer.
Validity is by construction (dtypes/shapes tracked per variable; the yield window respects
§3.6 rule 4); the checker must accept every generated program.

Every value must agree bit for bit (NaNs equal, signed zeros distinguished); a run that fails must
fail in both modes with the same message. Failing programs,
shrunk by hypothesis, go to tests/regressions/*.oi and are replayed by
`test_regressions` (a regression file may start with `// inputs: seed=N` to fix the inputs).
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import oi2jax
from oi2jax.diagnostics import OiError

from conftest import NIGHTLY, assert_matches, graph_ops, run_both

REGRESSIONS = Path(__file__).resolve().parent / "regressions"
STEPS = 3

DECLS = """
dynamic {{ x: f32[2, 3]; y: f32[3]; c: f32; k: i32[2, 3]; }}
constant {{ w: f32[3, 3] @init({w}); }}
volatile {{
    a0: f32[2, 3] @init({a0}); a1: f32[2, 3]; a2: f32[2, 3] @init({a2});
    win: f32[2, 3]; rw: f32[2, 3];
    u0: f32[3] @init({u0}); u1: f32[3];
    p0: f32[2];
    r0: f32 @init({r0}); r1: f32;
    n0: i32[2, 3] @init({n0}); n1: i32[2, 3];
    q: bool;
    ad: f32[4];
    m8: i8[3] @init({m8}); h16: f16[3] @init(0.5);
    m4: i4[3] @init({m4}); p64: f64[2]; s64: i64[2];
}}
persistent {{
    cnt: i32 @init(0);
    P: f32[2, 3] @init({p});
    T(i): f32[3] @table @fixed(i=4) @init({t});
    G(i): f32[3] @table;
    A(r): f32[2] @auto_dim(r) @fixed(r=5);
    pf8: f8 @init({f8}); pb16: bf16 @init({b16}); ph16: f16 @init({h16});
}}
"""

F23 = ["x", "a0", "a1", "a2", "win", "rw"]
F3 = ["y", "u0", "u1"]
FS = ["c", "r0", "r1"]
I23 = ["k", "n0", "n1"]
# never written by generated ops: c bounds a loop; rw belongs to the reader; x to the writer
# inside the yield window (and is a dynamic input, so writing it elsewhere is fine)
READ_ONLY = {"c", "rw"}


def _flt(rnd) -> str:
    return rnd.choice(["0.0", "0.5", "-1.25", "2.0", "0.125", "-0.75", "1.0"])


class Gen:
    def __init__(self, rnd: random.Random):
        self.rnd = rnd
        self.blocks: list[tuple[str, list[str]]] = []
        self.nblocks = 0
        self.loops = 0

    # ------------------------------------------------------------------ pieces

    def dst(self, pool, banned):
        options = [v for v in pool if v not in READ_ONLY and v not in banned]
        return self.rnd.choice(options) if options else None

    def index(self, scope) -> str:
        r = self.rnd.random()
        if scope and r < 0.5:
            return self.rnd.choice(scope)
        if r < 0.65:
            return "cnt"
        return str(self.rnd.randrange(4))

    def op(self, banned) -> str | None:
        r = self.rnd
        kind = r.randrange(13)
        if kind == 0:  # binary f32 [2,3]
            d = self.dst(F23, banned)
            return d and f"op {r.choice(['add', 'sub', 'mul', 'max', 'min'])}({r.choice(F23)}, {r.choice(F23)}) >> {d};"
        if kind == 1:  # broadcast [2,3] x [3] / scalar
            d = self.dst(F23, banned)
            other = r.choice(F3 + FS)
            return d and f"op {r.choice(['add', 'sub', 'mul'])}({r.choice(F23)}, {other}) >> {d};"
        if kind == 2:  # unary
            pool = r.choice([F23, F3, FS])
            d = self.dst(pool, banned)
            u = r.choice(["neg(%s)", "abs(%s)", "relu(%s, alpha=0.1)", "relu(%s, alpha=0.0, clamp_max=2.0)",
                          "clamp(%s, min=-3.0, max=3.0)", "fill(%s, value=1.5)", "relu(%s, alpha=r0)",
                          "floor(%s)", "round(%s)"])
            return d and f"op {u % r.choice(pool)} >> {d};"
        if kind == 3:  # matmul (kept bounded by a clamp)
            d = self.dst(F23, banned)
            return d and f"op matmul({r.choice(F23)}, w) >> {d}; op clamp({d}, min=-50.0, max=50.0) >> {d};"
        if kind == 4:  # reductions
            choice = r.randrange(4)
            if choice == 0:
                d = self.dst(F3, banned)
                return d and f"op {r.choice(['sum_axis', 'max_axis', 'mean_axis'])}({r.choice(F23)}, axes=[0]) >> {d};"
            if choice == 1:
                d = self.dst(["p0"], banned)
                return d and f"op {r.choice(['sum_axis', 'min_axis', 'mean_axis'])}({r.choice(F23)}, axes=[1]) >> {d};"
            if choice == 2:
                d = self.dst(FS, banned)
                return d and f"op sum_axis({r.choice(F3)}, axes=[0]) >> {d};"
            d = self.dst(FS, banned)
            return d and f"op max_axis({r.choice(F23)}, axes=[0, 1]) >> {d};"
        if kind == 5:  # exact integer arithmetic (wraps)
            d = self.dst(I23, banned)
            return d and f"op {r.choice(['add', 'sub', 'mul', 'max', 'min'])}({r.choice(I23)}, {r.choice(I23)}) >> {d};"
        if kind == 6:  # predicates
            d = self.dst(["q"], banned)
            a, b = r.choice(FS), r.choice(FS)
            return d and r.choice([f"op gt({a}, {b}) >> q;", f"op is_finite({r.choice(F23)}) >> q;",
                                   f"op le({a}, {b}) >> q;"])
        if kind == 7:  # auto_dim round trip
            if "ad" in banned or "A" in banned:
                return None
            return r.choice(["cache.read A[2] >> ad; op add(ad, ad) >> ad; cache.write ad >> A[2];",
                             "cache.read A[2] >> ad;", "cache.reset A;"])
        if kind == 8:  # plain persistent
            d = self.dst(F23, banned)
            if d is None or "P" in banned:
                return None
            return r.choice([f"cache.read P >> {d};", f"cache.write {d} >> P;", "cache.reset P;"])
        if kind == 9:  # barrier / dep
            return r.choice(["barrier;", f"dep after({r.choice(F23)}) before({r.choice(F3)});"])
        if kind == 11:  # narrow dtypes: i8 wraps, f16 rounds once per op; float div by zero -> NaN mask
            choice = r.randrange(3)
            if choice == 0:
                d = self.dst(["m8"], banned)
                return d and f"op {r.choice(['add', 'mul', 'sub'])}(m8, m8) >> m8;"
            if choice == 1:
                d = self.dst(["h16"], banned)
                return d and f"op {r.choice(['add', 'mul', 'sub'])}(h16, h16) >> h16;"
            d = self.dst(F23, banned)
            return d and f"op div({r.choice(F23)}, {r.choice(F23)}) >> {d};"
        if kind == 12:  # issue 15: @init through the SPEC encoders, packed wraps, both acc dialects
            choice = r.randrange(4)
            if choice == 0:
                if {"pf8", "pb16", "ph16"} & banned:
                    return None
                target = r.choice(["pf8", "pb16", "ph16"])
                return r.choice([f"cache.reset {target};", f"cache.increment {target};",
                                 f"cache.decrement 2 {target};"])
            if choice == 1:
                d = self.dst(["m4"], banned)
                return d and f"op {r.choice(['add', 'mul', 'sub'])}(m4, m4) >> m4;"
            if choice == 2:
                d = self.dst(["p64"], banned)
                return d and f"op {r.choice(['sum_axis', 'mean_axis', 'prod_axis'])}({r.choice(F23)}, axes=[1], " \
                             f"acc=[f64, f64]) >> p64;"
            d = self.dst(["s64"], banned)
            return d and r.choice([f"op sum_axis({r.choice(I23)}, axes=[1], acc=[i64, i64]) >> s64;",
                                   f"op sum_axis({r.choice(I23)}, axes=[1], acc=i64) >> s64;",
                                   f"op prod_axis({r.choice(I23)}, axes=[1], acc=[i64, i64]) >> s64;"])
        if kind == 10:  # transfer
            d = self.dst(F23, banned)
            return d and f"transfer {r.choice(F23)} >> {d};"
        return None

    def cache(self, scope, banned) -> str | None:
        r = self.rnd
        kind = r.randrange(6)
        if "T" in banned or "G" in banned:
            return None
        if kind == 0:
            return f"cache.write {r.choice(F3)} >> T[{self.index(scope)}];"
        if kind == 1:
            d = self.dst(F3, banned)
            return d and f"cache.read T[{self.index(scope)}] >> {d};"
        if kind == 2:
            d = self.dst(F23, banned)
            sl = r.choice(["0..2", "1..3", "2..", "..2", "..-2", "2..4", "cnt..", "..-cnt"])
            if "cnt" in sl:  # only valid when it yields exactly two rows: use the safe ones
                sl = r.choice(["0..2", "..-2"])
            return d and f"cache.read T[{sl}] >> {d};"
        if kind == 3:
            return f"cache.write {r.choice(F3)} >> G[{self.index(scope)}];"
        if kind == 4:
            d = self.dst(F3, banned)
            return d and f"cache.read G[{self.index(scope)}] >> {d};"
        return r.choice([f"cache.reset T[{r.randrange(4)}];", "cache.reset T[];", "cache.reset G[];",
                         f"cache.reset G[{self.index(scope)}];"])

    def stmts(self, depth: int, scope: list[str], banned: set[str], allow_branch: bool, n: int) -> list[str]:
        out: list[str] = []
        r = self.rnd
        for _ in range(n):
            kind = r.random()
            if kind < 0.45:
                s = self.op(banned)
            elif kind < 0.65:
                s = self.cache(scope, banned)
            elif kind < 0.8 and depth < 2:
                self.loops += 1
                var = f"i{self.loops}"
                bound = r.choice(["0..2", "0..3", "1..3", "0..cnt", "0..c", "2..1", "0..0"])
                body = self.stmts(depth + 1, scope + [var], banned, allow_branch, r.randrange(1, 4))
                if r.random() < 0.2:
                    body.insert(r.randrange(len(body) + 1), "return;")
                s = f"loop L{self.loops} ({var} in {bound}) {{ " + " ".join(body) + " }"
            elif kind < 0.95 and allow_branch and self.nblocks < 5:
                s = self.branch(depth, banned)
            else:
                s = None
            if s:
                out.append(s)
        return out

    def branch(self, depth, banned) -> str:
        r = self.rnd
        names = []
        uncond = r.random() < 0.3
        for _ in range(1 if uncond else 2):
            self.nblocks += 1
            name = f"b{self.nblocks}"
            body = self.stmts(depth + 1, [], banned, depth < 1, r.randrange(1, 4))
            if r.random() < 0.3:
                body.insert(r.randrange(len(body) + 1), "return;")
            self.blocks.append((name, body))
            names.append(name)
        if uncond:
            return f"branch {names[0]};"
        cond = r.choice([f"op gt({r.choice(FS)}, {r.choice(FS)}) >> q;", f"op is_finite({r.choice(F23)}) >> q;",
                         "op lt(r0, c) >> q;", ""])
        if "q" in banned:
            cond = ""
        return f"{cond} branch q {names[0]} {names[1]};"

    # ------------------------------------------------------------------ program

    def program(self) -> str:
        r = self.rnd
        header = DECLS.format(w=_flt(r), a0=_flt(r), a2=_flt(r), u0=_flt(r), r0=_flt(r), p=_flt(r), t=_flt(r),
                              n0=r.choice(["0", "7", "-3", "2147483647"]), m8=r.choice(["100", "-128", "1"]),
                              m4=r.choice(["7", "-8", "3"]), f8=r.choice(["9.0", "-7.9375", "0.1", "3.0"]),
                              b16=r.choice(["1.00390625", "0.1", "-2.5"]), h16=r.choice(["0.1", "65504.0", "-0.3"]))
        entry = []
        if r.random() < 0.7:
            entry.append("cache.increment cnt;")
        entry += self.stmts(0, [], set(), True, r.randrange(2, 7))
        consumers = []
        if r.random() < 0.6:
            # the window: entry must not write x, rw, or anything a consumer writes; no caches (rule 4)
            writer_extra = r.choice(["a1", None])
            banned = {"x", "rw", "T", "G", "A", "P", "ad", "cnt", "pf8", "pb16", "ph16"} | \
                ({writer_extra} if writer_extra else set())
            window = self.stmts(1, [], banned, False, r.randrange(0, 4))
            entry += ["yield x;", *window, "await x;"]
            wbody = [f"op {r.choice(['add', 'mul', 'sub'])}(x, {r.choice(['a0', 'a2', 'x'])}) >> x;"]
            if writer_extra:
                wbody.append(f"op neg(x) >> {writer_extra};")
            if r.random() < 0.3:  # a consumer's cache write, merged at the await (issue 15)
                wbody.append("cache.write x >> P;")
            consumers.append(("writer", ["await x;", *wbody, "yield x;"]))
            consumers.append(("reader", ["await x;", f"op {r.choice(['add', 'mul'])}(x, {r.choice(['a0', 'a2', 'win'])}) >> rw;",
                                         "yield x;"]))
            entry += self.stmts(0, [], set(), True, r.randrange(0, 3))
        entry.append("return;")
        text = header + "block entry {\n    " + "\n    ".join(entry) + "\n}\n"
        for name, body in self.blocks + consumers:
            text += f"block {name} {{\n    " + "\n    ".join(body) + "\n}\n"
        return text


def gen_program(rnd: random.Random) -> str:
    return Gen(rnd).program()


def gen_inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((2, 3)).astype(np.float32),
        "y": rng.standard_normal(3).astype(np.float32),
        "c": np.float32(rng.uniform(0.0, 3.5)),
        "k": rng.integers(-100, 100, (2, 3)).astype(np.int32),
    }


def differential(text: str, seed: int = 0, yield_mode: str = "fused") -> None:
    """Interpreted vs compiled (fused by default: driver == fused is proven by test_driver,
    test_session and test_node_tables; the nightly profile also runs the driver here), through
    conftest.run_both: bit for bit, or the same runtime error (e.g. a table overflow)."""
    try:
        run_both(text, gen_inputs(seed), STEPS, ways=("interpreted", yield_mode))
    except OiError:
        pass  # both ways failed, with the same message (run_both asserted it)


# ------------------------------------------------------------------------------------- tests


def test_generated_programs_check_clean():
    from oi2jax.check import check
    for seed in range(100):
        text = gen_program(random.Random(seed))
        errors = [d for d in check(oi2jax.parse(text)) if d.severity == "error"]
        assert not errors, "\n".join(d.render(text) for d in errors) + "\n" + text


# 100 derandomized programs in `make test` (about a third of the suite's time: one XLA compile each);
# 400 in the nightly profile (`make test-nightly`), plus 200 more run with the yield/await driver
@settings(max_examples=400 if NIGHTLY else 100, deadline=None, derandomize=True, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.randoms(use_true_random=False), st.integers(0, 1000))
def test_compiled_matches_interpreted(rnd, seed):
    differential(gen_program(rnd), seed)


@pytest.mark.skipif(not NIGHTLY, reason="nightly profile (make test-nightly): the driver on random programs")
@settings(max_examples=200, deadline=None, derandomize=True, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.randoms(use_true_random=False), st.integers(0, 1000))
def test_compiled_driver_matches_interpreted(rnd, seed):
    differential(gen_program(rnd), seed, yield_mode="driver")


def _regressions():
    return sorted(REGRESSIONS.glob("*.oi")) if REGRESSIONS.is_dir() else []


@pytest.mark.parametrize("path", _regressions(), ids=lambda p: p.stem)
def test_regressions(path):
    text = path.read_text()
    seed = 0
    first = text.splitlines()[0] if text else ""
    if first.startswith("// inputs: seed="):
        seed = int(first.split("=", 1)[1])
    differential(text, seed)


from conftest import SPEC_EXAMPLE_NAMES as EXAMPLE_NAMES  # noqa: E402


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_examples_compiled_matches_interpreted(name):
    from conftest import EXAMPLES, MODELS
    from oi2jax import dtypes as dt
    model = MODELS / f"{name}.oinf"
    assert model.exists(), f"no reference model for {name}"
    interp = oi2jax.compile(EXAMPLES / f"{name}.oi", model=model, mode="interpret")
    rng = np.random.default_rng(7)
    inputs = {}
    for decl in interp.graph.vars_of(oi2jax.ir.MemKind.DYNAMIC):
        shape = interp.bound.shape(decl.name)
        inputs[decl.name] = (np.array(True) if decl.dtype == "bool"
                             else rng.standard_normal(shape).astype(dt.get(decl.dtype).np_dtype))
    comp = oi2jax.compile(EXAMPLES / f"{name}.oi", model=model, mode="compiled")
    assert_matches(comp.run(inputs, steps=STEPS), interp.run(inputs, steps=STEPS), graph_ops(EXAMPLES / f"{name}.oi"),
                   name)  # bit for bit on a CPU
