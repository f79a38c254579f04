"""MSCCL XML reader and writer: round trips, dialects, and the runtimes' lexical rules."""
from pathlib import Path

import pytest

from taccl.errors import UserError
from taccl.program import Buf, Gpu, Program, Proto, Step, StepType, Threadblock
from taccl.xmlio import LEGACY_DEFAULT_MAX_BYTES, parse_xml, program_to_xml, read_xml, write_program

DATA = Path("/work/shared/data/msccl-xml")
if not DATA.exists():
    DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "msccl-xml"
SHARED = sorted(DATA.glob("*.xml"))

MIN = """<algo name="ar2" proto="LL" nchannels="1" nchunksperloop="2" ngpus="2" coll="allreduce" inplace="1" outofplace="0" minBytes="0" maxBytes="0">
  <gpu id="0" i_chunks="2" o_chunks="0" s_chunks="0">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrcs" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="r" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="2" o_chunks="0" s_chunks="0">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrcs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="r" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"""


def small_program() -> Program:
    steps = [Step(s=0, type=StepType.SEND, srcbuf=Buf.INPUT, srcoff=0, dstbuf=Buf.OUTPUT, dstoff=0, cnt=1,
                  hasdep=True)]
    return Program(name="x", collective="reducescatter", proto=Proto.SIMPLE, nchannels=1, nchunksperloop=2, ngpus=2,
                   inplace=False, outofplace=True, min_bytes=64, max_bytes=1024, extra={"redop": "nop"},
                   gpus=[Gpu(id=0, i_chunks=2, o_chunks=1, threadblocks=[Threadblock(id=0, send=1, steps=steps)]),
                         Gpu(id=1, i_chunks=2, o_chunks=1, s_chunks=3)])


def test_minimal_example_reads_and_writes_back_identically():
    res = parse_xml(MIN)
    p = res.program
    assert res.dialect == "executor" and res.notes == []
    assert (p.collective, p.proto, p.ngpus, p.inplace, p.outofplace, p.max_bytes) == ("allreduce", Proto.LL, 2,
                                                                                       True, False, 0)
    st = p.gpus[0].threadblocks[0].steps[1]
    assert st.type is StepType.RECV_REDUCE_COPY_SEND and st.srcbuf is Buf.INPUT and st.line == 5
    assert program_to_xml(p) == MIN


@pytest.mark.parametrize("path", SHARED, ids=[p.name for p in SHARED])
def test_shared_files_round_trip(path):
    res = read_xml(path)
    again = parse_xml(program_to_xml(res.program, dialect=res.dialect), dialect=res.dialect)
    assert again.program == res.program
    if "<!--" not in path.read_text():
        assert program_to_xml(res.program, dialect=res.dialect) == path.read_text()


def test_shared_dialects_detected():
    got = {p.name: read_xml(p).dialect for p in SHARED}
    assert got["ar_ll128.xml"] == "legacy"
    assert got["r48ll.xml"] == "executor"


def test_executor_round_trip_keeps_everything(tmp_path):
    p = small_program()
    text = program_to_xml(p)
    assert 'coll="reducescatter"' in text and 'outofplace="1"' in text and 'minBytes="64"' in text
    assert 'maxBytes="1024"' in text and 'redop="nop"' in text
    out = write_program(p, tmp_path / "a.xml")
    assert read_xml(out).program == p


def test_legacy_writer_and_reader():
    p = small_program()
    text = program_to_xml(p, dialect="legacy")
    assert 'coll="reduce_scatter"' in text and "outofplace" not in text
    assert 'maxBytes="1025"' in text  # legacy maxBytes is exclusive
    res = parse_xml(text)
    assert res.dialect == "legacy" and res.program == p
    p.max_bytes = 0
    assert parse_xml(program_to_xml(p, dialect="legacy")).program.max_bytes == (1 << 63) - 2
    p.inplace = True
    with pytest.raises(UserError, match="either in-place or out-of-place"):
        program_to_xml(p, dialect="legacy")


def test_legacy_defaults():
    text = MIN.replace(' outofplace="0" minBytes="0" maxBytes="0"', "")
    res = parse_xml(text)
    assert res.dialect == "legacy"
    assert res.program.max_bytes == LEGACY_DEFAULT_MAX_BYTES - 1 and res.program.inplace and not res.program.outofplace
    with pytest.raises(UserError, match="missing required attribute outofplace"):
        parse_xml(text, dialect="executor")


def test_writer_output_obeys_lexical_rules():
    p = small_program()
    for dialect in ("executor", "legacy"):
        text = program_to_xml(p, dialect=dialect)
        assert not text.startswith("<?xml") and "\t" not in text and "'" not in text and "  =" not in text
        for line in text.splitlines():
            assert line.count("<") == 1 and line.rstrip().endswith(">")
            assert "  " not in line.strip()


def test_writer_rejects_unwritable_values():
    p = small_program()
    p.name = 'a"b'
    with pytest.raises(UserError, match="cannot be written"):
        program_to_xml(p)


def test_ignored_elements_are_notes():
    text = MIN.replace('  <gpu id="1"', '  <copy i_off="0" o_off="0"/>\n  <gpu id="1"').replace(
        '<tb id="0" send="1"', '<copy a="1"></copy>\n    <tb id="0" send="1"')
    res = parse_xml(text)
    assert res.program == parse_xml(MIN).program
    assert len(res.notes) == 2 and all("ignored" in str(n) for n in res.notes)


def test_comments_and_closed_steps_are_accepted():
    text = "<!-- head -->\n" + MIN.replace('hasdep="0"/>\n    </tb>\n  </gpu>\n  <gpu id="1"',
                                          'hasdep="0"></step>\n    </tb>\n  </gpu>\n<!--x-->\n  <gpu id="1"')
    assert parse_xml(text).program == parse_xml(MIN).program


def test_hex_integers_and_octal_trap():
    assert parse_xml(MIN.replace('nchunksperloop="2"', 'nchunksperloop="0x2"')).program.nchunksperloop == 2
    with pytest.raises(UserError, match="octal"):
        parse_xml(MIN.replace('nchunksperloop="2"', 'nchunksperloop="02"'))


LEXICAL = [
    ('<?xml version="1.0"?>\n' + MIN, "XML declaration", 1),
    (MIN.replace("    <tb id=\"0\" send=\"1\"", "\t<tb id=\"0\" send=\"1\""), "tab", 3),
    (MIN.replace('coll="allreduce" inplace', 'coll="allreduce"\ninplace'), "line break", 1),
    (MIN.replace('<tb id="0" send="1"', '<tb id="0"  send="1"'), "single space", 3),
    (MIN.replace('<tb id="0" send="1"', '<tb id = "0" send="1"'), "around '='", 3),
    (MIN.replace('<tb id="0" send="1"', "<tb id='0' send=\"1\""), "double quotes", 3),
    (MIN.replace('<tb id="0" send="1"', '<tb id=0 send="1"'), "double quotes", 3),
    (MIN.replace('hasdep="0"/>', 'hasdep="0" />', 1), "space before", 4),
    (MIN.replace("</tb>", "</tb >", 1), "closing tag", 7),
    (MIN.replace("</tb>", "</gpu>", 1), "does not match", 7),
    (MIN.replace("</algo>\n", ""), "not closed", 15),
    (MIN.replace('<gpu id="1"', 'text <gpu id="1"'), "expected '<'", 9),
    (MIN.replace('<algo name', '<gpu id="0" i_chunks="0" o_chunks="0" s_chunks="0"/>\n<algo name'), "first element", 1),
    (MIN + MIN, "after </algo>", 17),
    (MIN.replace('type="rrcs"', 'type="ra"', 1), "not an instruction", 5),
    (MIN.replace('srcbuf="i" srcoff="1"', 'srcbuf="x" srcoff="1"', 1), "must be i, o or s", 4),
    (MIN.replace(' hasdep="0"', "", 1), "missing required attribute hasdep", 4),
    (MIN.replace('cnt="1"', 'cnt="one"', 1), "not an integer", 4),
    (MIN.replace('proto="LL"', 'proto="ll"'), "Simple, LL or LL128", 1),
    (MIN.replace('coll="allreduce"', 'coll="gather"').replace(' outofplace="0"', ''), "missing required attribute outofplace", 1),
    (MIN.replace(' chan="0">', ">", 1), "missing required attribute chan", 3),
    (MIN.replace('minBytes="0"', 'minBytes="9"').replace('maxBytes="0"', 'maxBytes="8"'), "larger than", 1),
    ("", "no <algo>", 1),
    (MIN[:MIN.index('dstbuf="i"') + len('dstbuf="i"')], "unexpected end of file after attribute dstbuf", 4),
]


@pytest.mark.parametrize("text,message,line", LEXICAL, ids=[m for _, m, _ in LEXICAL])
def test_reader_rejects_with_location(text, message, line):
    with pytest.raises(UserError) as exc:
        parse_xml(text, path="f.xml")
    msg = str(exc.value)
    assert message in msg
    assert msg.startswith(f"f.xml: line {line}")


def test_error_names_rank_tb_and_step():
    with pytest.raises(UserError) as exc:
        parse_xml(MIN.replace('<step s="2" type="r" srcbuf="i" srcoff="0"', '<step s="2" type="q" srcbuf="i" srcoff="0"'))
    assert "line 13 (rank 1, tb 0, step 2)" in str(exc.value)


def test_more_than_16_attributes_are_dropped_with_a_note():
    extra = " ".join(f'x{i}="{i}"' for i in range(8))
    res = parse_xml(MIN.replace('maxBytes="0">', f'maxBytes="0" {extra}>'))
    assert len(res.program.extra) == 6 and any("first 16" in str(n) for n in res.notes)


def test_a_required_attribute_past_the_16th_is_missing_and_the_cap_is_named():
    extra = " ".join(f'x{i}="{i}"' for i in range(20))
    with pytest.raises(UserError, match="missing required attribute name .it has more than 16 attributes"):
        parse_xml(MIN.replace("<algo name", f"<algo {extra} name"))


def test_read_missing_file_is_user_error(tmp_path):
    with pytest.raises(UserError, match="not found"):
        read_xml(tmp_path / "nope.xml")


def test_collective_spelling_per_dialect():
    with pytest.raises(UserError, match="executor spells it reducescatter"):
        parse_xml(MIN.replace('coll="allreduce"', 'coll="reduce_scatter"'), dialect="executor")
    with pytest.raises(UserError, match="legacy runtime spells it reduce_scatter"):
        parse_xml(MIN.replace('coll="allreduce"', 'coll="reducescatter"'), dialect="legacy")
    legacy = MIN.replace('coll="allreduce"', 'coll="reduce_scatter"').replace(' outofplace="0" minBytes="0" maxBytes="0"', "")
    assert parse_xml(legacy).program.collective == "reducescatter"
