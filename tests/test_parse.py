"""Parser: every construct of SPEC §1.3/§1.4 builds the right IR; syntax errors are located OiErrors."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from oi2jax import ir
from oi2jax.diagnostics import OiError
from oi2jax.grammar import parse, parse_file

SPEC_15 = """\
dynamic   { tokens: f32[B, D]; mask: bool; }
constant  { scale: f32; Wt(k): f32[D, D] @pattern("proj.{k}.weight"); n_proj: u32; }
volatile  { acc: f32[B, D] @init(0.0); flags: i8[B, D]; }
persistent {
    cursor: i64 @init(0);
    Hist(slot): f32[D] @table @fixed(slot=8);
    Grow(r, c): f32[2, 2] @auto_dim(r, c) @fixed(r=6);
}

block entry {
    assign tmp: f32[B, D];
    op mul(tokens, scale) >> tmp;
    loop proj (k in 0..n_proj) {
        op matmul(tmp, Wt[k]) >> tmp;
        op relu(tmp, alpha=0.05, clamp_max=4.0) >> tmp;
    }
    op sign(tmp) >> flags;
    assign rowsum: f32[B, 1];
    op sum_axis(tmp, axes=[-1], keepdims=true) >> rowsum;
    assign last: f32[D];
    cache.read Hist[cursor] >> last;       // grows Hist size to cursor+1 (<= 8)
    cache.write last >> Hist[cursor];
    cache.increment cursor;                // amount 1
    cache.decrement 2 cursor;              // explicit amount
    branch mask on_mask off_mask;          // call on_mask or off_mask, then continue
    barrier;
    dep after(tmp) before(acc);
    return;
}
block on_mask  { op fill(acc, value=1.0) >> acc; return; }
block off_mask { op add(acc, tmp) >> acc; return; }
"""


def one_node(body: str, decls: str = ""):
    g = parse(decls + "block entry { " + body + " }")
    return g.blocks[0].nodes[0]


def err(text: str) -> OiError:
    with pytest.raises(OiError) as info:
        parse(text, "t.oi")
    e = info.value
    assert e.source == text
    return e


def loc(e: OiError):
    d = e.diagnostics[0]
    return d.span.line, d.span.col, d.message


# ---------------------------------------------------------------- SPEC §1.5 example

def test_spec_example_declarations():
    g = parse(SPEC_15, "ex.oi")
    v = g.var_map
    assert [d.name for d in g.vars] == ["tokens", "mask", "scale", "Wt", "n_proj", "acc", "flags", "cursor",
                                         "Hist", "Grow"]
    assert v["tokens"].kind == ir.MemKind.DYNAMIC and v["tokens"].dims == (ir.Dim(("B",)), ir.Dim(("D",)))
    assert v["mask"].dtype == "bool" and v["mask"].is_scalar
    assert v["Wt"].pattern == "proj.{k}.weight" and v["Wt"].index_params == ("k",) and v["Wt"].is_prefix_table
    assert v["acc"].init == ir.Literal("float", 0.0) and v["acc"].kind == ir.MemKind.VOLATILE
    assert v["cursor"].init == ir.Literal("int", 0) and v["cursor"].kind == ir.MemKind.PERSISTENT
    assert v["Hist"].is_table and v["Hist"].fixed == (("slot", 8),)
    assert v["Grow"].auto_dim == ("r", "c") and v["Grow"].is_auto_dim and v["Grow"].fixed_sizes({}) == {"r": 6}
    assert v["tokens"].span == ir.Span("ex.oi", 1, 13)
    assert v["Hist"].attr_span("fixed") == ir.Span("ex.oi", 6, 31)


def test_spec_example_nodes_and_numbering():
    g = parse(SPEC_15, "ex.oi")
    entry = g.entry
    kinds = [type(n).__name__ for n in entry.nodes]
    assert kinds == ["Assign", "Op", "Loop", "Op", "Assign", "Op", "Assign", "CacheRead", "CacheWrite",
                     "CacheIncrement", "CacheDecrement", "Branch", "Barrier", "Dep", "Return"]
    loop = entry.nodes[2]
    assert [n.index for n in loop.body] == [2, 3] and loop.index == 4
    assert (loop.name, loop.var, loop.start, loop.end) == ("proj", "k", 0, "n_proj")
    assert loop.body[0].inputs[1] == ir.VarRef("Wt", ir.Span("ex.oi", 14, 24), ("k",))
    relu = loop.body[1]
    assert relu.attr_map == {"alpha": ir.Literal("float", 0.05), "clamp_max": ir.Literal("float", 4.0)}
    assert entry.nodes[5].attr_map == {"axes": ir.Literal("int_list", (-1,)), "keepdims": ir.Literal("bool", True)}
    assert entry.nodes[9] .amount == 1 and not entry.nodes[9].explicit_amount
    assert entry.nodes[10].amount == 2 and entry.nodes[10].explicit_amount
    br = entry.nodes[11]
    assert (br.cond, br.then_block, br.else_block) == ("mask", "on_mask", "off_mask")
    assert entry.nodes[13].after == "tmp" and entry.nodes[13].before == "acc"
    assert [n.index for n in g.blocks[1].nodes] == [17, 18]
    assert [n.index for n in g.blocks[2].nodes] == [19, 20]
    assert entry.nodes[1].span == ir.Span("ex.oi", 12, 5) and entry.nodes[1].output_span == ir.Span("ex.oi", 12, 30)


def test_numbering_nested_loops():
    g = parse("block entry { op a(x) >> y; loop L (i in 0..2) { op b(x) >> y; loop M (j in 1..n) { barrier; } "
              "op c(x) >> y; } return; }")
    n = g.entry.nodes
    assert n[0].index == 0
    loop = n[1]
    assert [b.index for b in loop.body[:1]] == [1]
    assert loop.body[1].body[0].index == 2 and loop.body[1].index == 3
    assert loop.body[2].index == 4 and loop.index == 5 and n[2].index == 6


# ---------------------------------------------------------------- declarations

def test_dims_forms():
    g = parse("volatile { a: f32[B*D, 3*D, K*2, 4]; b: f32[]; c: i8; d: f32[B D]; e: f32[B, D,]; }")
    v = g.var_map
    assert v["a"].dims == (ir.Dim(("B", "D")), ir.Dim((3, "D")), ir.Dim(("K", 2)), ir.Dim((4,)))
    assert v["b"].dims == () and v["c"].dims == ()
    assert v["d"].dims == v["e"].dims == (ir.Dim(("B",)), ir.Dim(("D",)))


@pytest.mark.parametrize("text,kind,value", [
    ("@init(1.5)", "float", 1.5), ("@init(-2.5e-3)", "float", -2.5e-3), ("@init(3)", "int", 3),
    ("@init(-7)", "int", -7), ("@init(true)", "bool", True), ("@init(false)", "bool", False),
    ("@init(2E+2)", "float", 200.0), ("@init(3.0)", "float", 3.0),
])
def test_init_literals(text, kind, value):
    d = parse(f"volatile {{ x: f32 {text}; }}").vars[0]
    assert d.init == ir.Literal(kind, value)
    # a float spelt other than its canonical text (`2E+2`, `-2.5e-3`) keeps that text (ir.FloatLit, a float)
    assert type(d.init.value) is type(value) or (kind == "float" and isinstance(d.init.value, ir.FloatLit))


def test_ref_and_attributes():
    g = parse('constant { a: f32 @ref("w.0"); b: f32 @ref(weights); c: f32 @ref(loop); }'
              'persistent { T(i, j): f16[4] @table @fixed(i=2 j=3) @auto_dim(j); }')
    v = g.var_map
    assert v["a"].ref == "w.0" and v["b"].ref == "weights" and v["c"].ref == "loop"
    assert v["T"].fixed == (("i", 2), ("j", 3)) and v["T"].auto_dim == ("j",) and v["T"].table
    assert v["T"].table_indices == ("i",)


def test_string_escapes():
    d = parse(r'constant { a(l): f32 @pattern("a\"b\\c.{l}"); }').vars[0]
    assert d.pattern == 'a"b\\c.{l}'


# ---------------------------------------------------------------- nodes

def test_op_attr_kinds():
    n = one_node('op f(x, W[l, 0], a=1, b=-2.5, c=1e-3, d=true, e="s", g=[1, -2 3], h=v, k=inf, acc=i32, '
                 'to=f16) >> y;')
    assert n.op == "f" and [str(r) for r in n.inputs] == ["x", "W[l, 0]"]
    assert n.inputs[1].indices == ("l", 0)
    m = n.attr_map
    assert m["a"] == ir.Literal("int", 1) and m["b"] == ir.Literal("float", -2.5)
    assert m["c"] == ir.Literal("float", 1e-3) and m["d"] == ir.Literal("bool", True)
    assert m["e"] == ir.Literal("str", "s") and m["g"] == ir.Literal("int_list", (1, -2, 3))
    assert m["h"] == ir.Literal("var", "v") and m["k"].kind == "float" and math.isinf(m["k"].value)
    assert m["acc"] == ir.Literal("dtype", "i32") and m["to"] == ir.Literal("dtype", "f16")
    assert n.output == "y"


def test_op_no_args_and_trailing_comma():
    assert one_node("op f() >> y;").inputs == ()
    assert [r.name for r in one_node("op f(a b,) >> y;").inputs] == ["a", "b"]
    assert one_node("op f(a, k=[]) >> y;").attr_map["k"] == ir.Literal("int_list", ())


def S(v):
    return ir.Single(v)


FULL = ir.Slice()


@pytest.mark.parametrize("text,indices,bracketed", [
    ("K", (), False), ("K[]", (), True), ("K[i]", (S("i"),), True), ("K[i, j]", (S("i"), S("j")), True),
    ("K[1 2]", (S(1), S(2)), True), ("K[a..b]", (ir.Slice("a", "b"),), True), ("K[..b]", (ir.Slice(None, "b"),), True),
    ("K[a..]", (ir.Slice("a", None),), True), ("K[..]", (FULL,), True), ("K[1, , 2]", (S(1), FULL, S(2)), True),
    ("K[1,]", (S(1), FULL), True), ("K[,]", (FULL,), True), ("K[, 1]", (FULL, S(1)), True),
    ("K[1,,]", (S(1), FULL), True), ("K[0..-1]", (ir.Slice(0, -1),), True), ("K[-1]", (S(-1),), True),
    ("K[2..5, t]", (ir.Slice(2, 5), S("t")), True),
])
def test_cache_access_forms(text, indices, bracketed):
    n = one_node(f"cache.read {text} >> y;")
    assert isinstance(n, ir.CacheRead)
    assert n.src.base == "K" and n.src.indices == indices and n.src.bracketed is bracketed
    assert n.dst == ir.VarRef("y", n.dst.span)


def test_cache_nodes():
    g = parse("block entry { cache.write x >> K[i, 0]; cache.increment 5 s; cache.decrement s; cache.reset K[]; "
              "cache.reset P; cache.read s >> v; }")
    w, inc, dec, r1, r2, rd = g.entry.nodes
    assert w.src.name == "x" and w.dst.indices == (S("i"), S(0))
    assert (inc.target, inc.amount, inc.explicit_amount) == ("s", 5, True)
    assert (dec.target, dec.amount, dec.explicit_amount) == ("s", 1, False)
    assert r1.target.bracketed and r1.target.indices == () and not r2.target.bracketed
    assert rd.src == ir.CacheAccess("s", rd.src.span)


def test_control_nodes():
    g = parse("block entry { branch t; branch c a b; yield a, b; await a, b,; barrier; "
              "dep after(cache.write) before(x); transfer W[1] >> y; return a, b; }"
              "block t { return; }")
    b1, b2, y, a, bar, dep, tr, ret = g.entry.nodes
    assert (b1.cond, b1.then_block, b1.else_block) == (None, "t", None)
    assert (b2.cond, b2.then_block, b2.else_block) == ("c", "a", "b")
    assert y.vars == ("a", "b") and a.vars == ("a", "b") and isinstance(bar, ir.Barrier)
    assert dep.after == "cache.write" and dep.before == "x"
    assert tr.src.indices == (1,) and tr.dst.name == "y"
    assert ret.vars == ("a", "b") and g.blocks[1].nodes[0].vars == ()


def test_comments():
    g = parse("// c\n/// doc\n/* block\ncomment */ dynamic { x: f32; /* in */ } // tail\nblock entry { return; }")
    assert [d.name for d in g.vars] == ["x"] and g.entry.nodes[0].index == 0


def test_contextual_keywords_as_names():
    g = parse("volatile { read: f32; table: f32; op: f32; block: f32; }"
              "block entry { op add(read, table) >> op; }")
    assert [d.name for d in g.vars] == ["read", "table", "op", "block"]
    assert g.entry.nodes[0].output == "op"


def test_empty_graph_and_sections_interleaved():
    assert parse("").vars == () and parse("").blocks == ()
    g = parse("block a { return; } dynamic { x: f32; } block entry { return; } dynamic { y: f32; }")
    assert [b.name for b in g.blocks] == ["a", "entry"] and [d.name for d in g.vars] == ["x", "y"]


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("text,line,col,message", [
    ("block entry { op f(k=1, x) >> y; }", 1, 25, "positional args must come before settings"),
    ("block entry { op f(x, k=1, k=2) >> y; }", 1, 28, "duplicate setting: k"),
    ("block entry { branch c a; }", 1, 15, "branch expects condition and two target blocks"),
    ("block entry { op f(x, k=-inf) >> y; }", 1, 25, "unexpected '-' before identifier"),
    ("block entry { op f(x, k=-true) >> y; }", 1, 25, "unexpected '-' before bool"),
    ("volatile { x: f32 @init(1.0) @init(2.0); }", 1, 30, "duplicate @init attribute"),
    ("volatile { x: f32 @init(-true); }", 1, 25, "unexpected '-' before bool"),
    ("volatile { x: f32 @frob; }", 1, 20, "unsupported attribute @frob"),
    ("volatile { x: f32 @auto_dim(); }", 1, 19, "@auto_dim requires at least one name"),
    ("volatile { x: f32 @fixed(); }", 1, 19, "@fixed requires at least one entry"),
    ("volatile { x(): f32; }", 1, 13, "index parameters must list at least one name"),
    ("volatile { x: f32[A*B*C]; }", 1, 22, "unexpected '*'"),
    ("volatile { x: f32[B*]; }", 1, 21, "expected identifier or integer for dimension expression"),
    ("volatile { x: foo; }", 1, 15, "unsupported dtype foo"),
    ("block entry { op f(W[]) >> y; }", 1, 21, "prefix access must include at least one index"),
    ("block entry { op f(x, acc=foo) >> y; }", 1, 23, "unsupported dtype foo for setting acc"),
    ("block entry { op f(x, to=3) >> y; }", 1, 23, "to must be a dtype identifier"),  # SPEC-2026-03 §1.4
    ('block entry { op f(x, to="f32") >> y; }', 1, 23, "to must be a dtype identifier"),
    ("block entry { frob x; }", 1, 15, "unsupported node frob"),
    ("block entry { cache.foo x; }", 1, 21, "unsupported cache operation cache.foo"),
    ("blok entry { }", 1, 1, "expected memory section or block"),
    ("block entry { loop l (i in ..3) { } }", 1, 28, "expected identifier or integer for loop range"),
    ("block entry { loop l (i in -1..3) { } }", 1, 28, "expected identifier or integer for loop range"),
    ("block entry { yield; }", 1, 20, "expected one of a name"),
    ("block entry { await; }", 1, 20, "expected one of a name"),
    ("block entry { cache.read K[-i] >> y; }", 1, 28, "unexpected '-' before identifier"),
    ("volatile { loop: f32; }", 1, 12, "'loop' is a reserved word"),
    ("volatile { _: f32; }", 1, 12, "'_' is a reserved word"),
    ("block entry { op f(x) >> y }", 1, 28, "unexpected '}'; expected one of ';'"),
    ("block entry { op f(x) > y; }", 1, 23, "unexpected character '>'; expected one of '>>'"),
    ("block entry { op f(x] >> y; }", 1, 21, "unexpected ']'"),
    ("block entry {\n  op f(x) >> y;\n", 2, 16, "unexpected end of input; expected one of 'assign', 'await'"),
])
def test_syntax_errors(text, line, col, message):
    e = err(text)
    got_line, got_col, got = loc(e)
    assert message in got
    assert (got_line, got_col) == (line, col), got
    rendered = e.render()
    assert rendered.startswith(f"t.oi:{line}:{col}: error: ")
    assert "^" in rendered
    for token_name in ("RSQB", "SEMICOLON", "RBRACE", "__ANON", "NAME", "$END"):
        assert token_name not in got


@pytest.mark.parametrize("text,line,col,message", [
    ("volatile { x: f33; }", 1, 15, "unsupported dtype f33 (did you mean f32?)"),
    ("volatile { x: F32; }", 1, 15, "unsupported dtype F32 (did you mean f32?)"),
    ("dynamc { x: f32; }", 1, 1, "expected memory section or block, got name 'dynamc' (did you mean dynamic?)"),
    ("blok entry { }", 1, 1, "expected memory section or block, got name 'blok' (did you mean block?)"),
    ("zzzzz entry { }", 1, 1, "expected memory section or block, got name 'zzzzz'"),
    ("volatile { x: f32 @inti(0.0); }", 1, 20, "unsupported attribute @inti (did you mean @init?)"),
    ("block entry { assgn t: f32; }", 1, 15, "unsupported node assgn (did you mean assign?)"),
    ("block entry { retrun; }", 1, 15, "unsupported node retrun (did you mean return?)"),
    ("block entry { cache.incremnt n; }", 1, 21, "unsupported cache operation cache.incremnt "
                                                 "(did you mean cache.increment?)"),
    ("block entry { op cast(x, to=f3) >> y; }", 1, 26, "unsupported dtype f3 for setting to (did you mean f32?)"),
])
def test_misspelt_keywords_suggest_the_word(text, line, col, message):
    """The contract's "did you mean" for dtypes, section names, attributes, node keywords and cache
    operations, as for variables and ops (frontend probe: these named the word and nothing more)."""
    got_line, got_col, got = loc(err(text))
    assert (got_line, got_col, got) == (line, col, message)


def test_error_words_are_dsl_words():
    e = err("volatile { x f32; }")
    msg = e.diagnostics[0].message
    assert msg == "unexpected 'f32'; expected one of '(', ':'"


def test_parse_file_missing(tmp_path):
    with pytest.raises(OiError) as info:
        parse_file(tmp_path / "nope.oi")
    assert info.value.render().startswith("error: cannot read ")


def test_parse_file_path_in_spans(tmp_path):
    p = tmp_path / "g.oi"
    p.write_text("dynamic { x: f32; }\nblock entry { return; }\n")
    g = parse_file(p)
    assert g.path == str(p) and g.vars[0].span == ir.Span(str(p), 1, 11) and g.source == p.read_text()


@pytest.mark.parametrize("literal,message", [
    ('"\\u{41"', "unterminated unicode escape '\\u{' in string (expected '}')"),
    ('"\\x+f"', "invalid escape '\\x+f' in string (expected two hex digits)"),
    ('"\\u{110000}"', "invalid unicode escape '\\u{110000}' in string"),
])
def test_bad_string_escapes_are_located_errors_not_hangs(literal, message):
    """Issue 19 item 1: an unterminated `\\u{` once reset the scan and looped forever."""
    from oi2jax.diagnostics import OiError
    with pytest.raises(OiError) as info:
        parse(f"constant {{ w: f32[2] @ref({literal}); }}")
    assert message in str(info.value) and ":1:" in str(info.value)


def test_missing_semicolon_is_reported_after_the_token_that_needed_it():
    """Issue 17: not at the start of the next line."""
    from oi2jax.diagnostics import OiError
    src = "dynamic { x: f32[2]; }\nvolatile { y: f32[2]; }\nblock entry {\n    op relu(x) >> y\n    return;\n}\n"
    with pytest.raises(OiError) as info:
        parse(src, "g.oi")
    assert str(info.value).splitlines()[0] == "g.oi:4:20: error: expected ';' before 'return'"
    with pytest.raises(OiError) as info:
        parse("dynamic {\n    x: f32[2]\n    y: f32[2];\n}\n", "g.oi")
    assert str(info.value).splitlines()[0] == "g.oi:2:14: error: expected ';' before name 'y'"


def test_a_grammar_rule_without_a_builder_method_is_an_error_not_a_tree():
    """The transformer's `__default__` raises: a rule with no method never slips a lark tree into the IR."""
    from lark import Tree
    from oi2jax.grammar.build import Builder
    with pytest.raises(TypeError, match="'no_such_rule' has no Builder method"):
        Builder("<t>").transform(Tree("no_such_rule", []))


def test_a_text_parsed_again_is_the_same_graph_and_errors_are_raised_each_time():
    """parse keeps the graph of a recent (text, path): the same immutable object again; another
    path is another graph (spans name it); a bad text raises each time (nothing cached)."""
    first = parse(SPEC_15, "a.oi")
    assert parse(SPEC_15, "a.oi") is first
    other = parse(SPEC_15, "b.oi")
    assert other is not first and other.path == "b.oi"
    assert [v.name for v in other.vars] == [v.name for v in first.vars]
    for _ in range(2):
        with pytest.raises(OiError, match="bad.oi:1"):
            parse("dynamic { x: f32[; }", "bad.oi")


@pytest.mark.parametrize("text,line,col,message", [
    ("block entry { return; }\n/* never closed\n", 2, 1, "unterminated block comment (no closing */)"),
    ("constant { w: f32 @ref(\"w.0); }\nblock entry { return; }\n", 1, 24, "unterminated string (no closing \")"),
])
def test_unterminated_comment_and_string_are_named(text, line, col, message):
    """Was `unexpected character '/'; expected one of 'block', a memory section` and `unexpected
    character '"'; expected one of a name, a string` (frontend probe)."""
    assert loc(err(text)) == (line, col, message)


def test_a_terminated_string_out_of_place_is_not_called_unterminated():
    assert loc(err('block entry { op f("x") >> y; }'))[2].startswith("unexpected '\"x\"'; expected one of")


@pytest.mark.parametrize("before,pad", [("日本語", 6), ("e\u0301e\u0301", 2), ("héllo→", 6), ("\t", 1)])
def test_the_caret_stays_under_the_column_after_wide_or_combining_characters(before, pad):
    """A CJK character takes two terminal columns and a combining accent none: the caret was
    padded one space per character, off by one column per such character (frontend probe)."""
    e = err(f"block entry {{ /*{before}*/ frob x; }}")
    shown, caret = e.render().splitlines()[1:3]
    assert shown == f"    block entry {{ /*{before.expandtabs(1)}*/ frob x; }}"
    assert caret == "    " + " " * (len("block entry { /*") + pad + len("*/ ")) + "^"


@pytest.mark.parametrize("given,message", [
    (None, "error: parse: expected program text (a str), got NoneType"),
    (b"block entry { return; }", "error: parse: expected program text (a str), got bytes"),
    (Path("g.oi"), "error: parse: expected program text (a str), got PosixPath; for a file, use "
                   "oi2jax.grammar.parse.parse_file(path)"),
])
def test_parse_of_something_not_text_is_an_oierror(given, message):
    """`oi2jax.parse(Path(...))` was `TypeError: object of type 'PosixPath' has no len()` (frontend probe)."""
    with pytest.raises(OiError) as info:
        parse(given)
    assert str(info.value) == message
