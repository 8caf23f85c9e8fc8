"""Dataset loading, validation and audit-context sampling (offline; every file is written to tmp_path)."""

import collections
import csv
import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from snapaudit_jax.dpicl import data
from snapaudit_jax.dpicl.data import AuditContext, Example, load_examples, sample_audit_context

DEMO = Path(data.__file__).parent / "demo"
needs_datasets = pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="needs `datasets`")
CLASSIFICATION = {"agnews": (4, 60), "trec": (6, 20)}  # name -> (classes, minimum per class)
MINIMUM_ROWS = {"agnews": 240, "trec": 180, "samsum": 120, "xsum": 100}


def _raw(name):
    """Independent oracle: the demo file read with the json module."""
    with open(DEMO / f"{name}_demo.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


AG_ROWS = [
    {"text": "Rain delays the harvest festival in the valley.", "label": 0},
    {"text": "Home side wins the derby after extra time.", "label": 1},
    {"text": "Bakery chain reports higher profits.", "label": 2},
    {"text": "New phone chip doubles battery life.", "label": 3},
    {"text": "Ministers meet to discuss river treaty.", "label": 0},
]


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "hf-cache"


def _ag_expected(split="train"):
    return [Example(r["text"], r["label"], None, f"agnews-{split}-{i}") for i, r in enumerate(AG_ROWS)]


# ----------------------------------------------------------------------------------------------------------------
# Specs and demo data.


def test_specs_match_the_hub_label_orders():
    assert data.get_spec("agnews").label_names == ("World", "Sports", "Business", "Sci/Tech")
    assert data.get_spec("trec").label_names == ("ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM")
    assert data.get_spec("trec").label_field == "coarse_label"
    assert "label-coarse" in data.get_spec("trec").label_aliases
    assert (data.get_spec("samsum").text_fields, data.get_spec("samsum").label_field) == (("dialogue",), "summary")
    assert (data.get_spec("xsum").text_fields, data.get_spec("xsum").label_field) == (("document",), "summary")
    assert {s.task for s in data.DATASETS.values()} == {"classification", "summarization"}
    hash(data.get_spec("trec"))  # static config is hashable


@pytest.mark.parametrize("name", sorted(MINIMUM_ROWS))
def test_demo_files_load_completely_and_match_the_raw_file(name):
    raw = _raw(name)
    examples = load_examples(name)
    spec = data.get_spec(name)
    assert len(examples) == len(raw) >= MINIMUM_ROWS[name]
    assert (DEMO / f"{name}_demo.jsonl").stat().st_size < 200_000
    for row, example in zip(raw, examples):
        assert example.text == row[spec.text_fields[0]]
        if spec.task == "classification":
            assert (example.label, example.target) == (row[spec.label_field], None)
        else:
            assert (example.label, example.target, example.id) == (None, row["summary"], row["id"])
    assert len({e.id for e in examples}) == len(examples)
    assert len({e.text for e in examples}) == len(examples), "demo texts must not repeat"


@pytest.mark.parametrize("name", sorted(CLASSIFICATION))
def test_demo_classification_files_cover_every_class(name):
    num_classes, minimum = CLASSIFICATION[name]
    counts = collections.Counter(e.label for e in load_examples(name))
    assert sorted(counts) == list(range(num_classes))
    assert min(counts.values()) >= minimum
    if name == "agnews":
        assert len(set(counts.values())) == 1, f"AG News demo must be balanced, got {counts}"


def test_demo_summarisation_files_have_the_documented_shape():
    turn = re.compile(r"^[A-Z][a-z]+: \S.*$")
    for example in load_examples("samsum"):
        lines = example.text.split("\n")
        assert 3 <= len(lines) <= 8, example.id
        assert all(turn.match(line) for line in lines), example.id
        assert example.target.count(". ") == 0 and example.target.endswith("."), example.id
    for example in load_examples("xsum"):
        sentences = re.split(r"(?<=[.!?\"])\s+(?=[A-Z])", example.text)
        assert 3 <= len(sentences) <= 6, (example.id, len(sentences))
        assert example.target.endswith("."), example.id


# ----------------------------------------------------------------------------------------------------------------
# Local files through `datasets`.


@needs_datasets
def test_jsonl_file(tmp_path, cache):
    path = _write_jsonl(tmp_path / "ag.jsonl", AG_ROWS)
    assert load_examples("agnews", path, cache_dir=cache) == _ag_expected()
    assert load_examples("agnews", str(path), split="test", cache_dir=cache) == _ag_expected("test")


@needs_datasets
def test_json_array_file(tmp_path, cache):
    path = tmp_path / "ag.json"
    path.write_text(json.dumps(AG_ROWS), encoding="utf-8")
    assert load_examples("agnews", path, cache_dir=cache) == _ag_expected()


@needs_datasets
def test_csv_file(tmp_path, cache):
    path = _write_csv(tmp_path / "ag.csv", ["text", "label"], [[r["text"], r["label"]] for r in AG_ROWS])
    assert load_examples("agnews", path, cache_dir=cache) == _ag_expected()


@needs_datasets
def test_parquet_file(tmp_path, cache):
    import datasets

    path = tmp_path / "ag.parquet"
    columns = {"text": [r["text"] for r in AG_ROWS], "label": [r["label"] for r in AG_ROWS]}
    datasets.Dataset.from_dict(columns).to_parquet(str(path))
    assert load_examples("agnews", path, cache_dir=cache) == _ag_expected()


@needs_datasets
def test_directory_with_one_file_per_split(tmp_path, cache):
    train = [
        {"id": f"d{i}", "dialogue": f"Ann: hi {i}\nBo: hello", "summary": f"Ann greets Bo ({i})."} for i in range(3)
    ]
    _write_jsonl(tmp_path / "train.jsonl", train)
    _write_csv(tmp_path / "test.csv", ["id", "dialogue", "summary"], [["t0", "Cy: bye\nDi: see you", "They part."]])
    got = load_examples("samsum", tmp_path, cache_dir=cache)
    assert got == [Example(r["dialogue"], None, r["summary"], r["id"]) for r in train]
    assert load_examples("samsum", tmp_path, split="test", cache_dir=cache) == [
        Example("Cy: bye\nDi: see you", None, "They part.", "t0")
    ]


@needs_datasets
def test_xsum_csv_with_integer_ids(tmp_path, cache):
    path = _write_csv(
        tmp_path / "x.csv", ["document", "summary", "id"], [["A. B. C.", "Short.", 3818], ["D. E. F.", "Shorter.", 17]]
    )
    got = load_examples("xsum", path, cache_dir=cache)
    assert [(e.text, e.target, e.id) for e in got] == [("A. B. C.", "Short.", "3818"), ("D. E. F.", "Shorter.", "17")]


@needs_datasets
def test_trec_accepts_the_older_label_coarse_column(tmp_path, cache):
    path = _write_csv(
        tmp_path / "trec.csv",
        ["label-coarse", "label-fine", "text"],
        [[5, 40, "How far is it?"], [0, 1, "What does UN mean?"]],
    )
    got = load_examples("trec", path, cache_dir=cache)
    assert [(e.text, e.label) for e in got] == [("How far is it?", 5), ("What does UN mean?", 0)]


# ----------------------------------------------------------------------------------------------------------------
# Subsets.


def test_limit_without_seed_takes_the_first_rows():
    full = load_examples("trec")
    assert load_examples("trec", limit=7) == full[:7]


def test_seeded_subset_is_reproducible_nested_and_seed_dependent():
    full = load_examples("agnews")
    a = load_examples("agnews", limit=20, seed=4)
    assert a == load_examples("agnews", limit=20, seed=4)
    # Oracle: the documented NumPy draw.
    assert a == [full[i] for i in np.random.default_rng(4).permutation(len(full))[:20]]
    assert load_examples("agnews", limit=8, seed=4) == a[:8]
    assert load_examples("agnews", limit=20, seed=5) != a
    assert len({e.id for e in a}) == 20
    shuffled = load_examples("agnews", seed=4)
    assert sorted(e.id for e in shuffled) == sorted(e.id for e in full) and shuffled != full


# ----------------------------------------------------------------------------------------------------------------
# Bad input: every case raises ValueError naming the problem.


def test_unknown_name_missing_path_and_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match=r"dataset name must be one of 'agnews'.*got 'imdb'"):
        load_examples("imdb")
    with pytest.raises(ValueError, match=r"path must be an existing file.*nope\.jsonl"):
        load_examples("agnews", tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match=r"split of the demo data .* must be 'train', got 'test'"):
        load_examples("agnews", split="test")
    with pytest.raises(ValueError, match=r"split must be .*got 'train\[:10\]'"):
        load_examples("agnews", split="train[:10]")
    with pytest.raises(ValueError, match=r"limit must be an integer >= 1, got 0"):
        load_examples("agnews", limit=0)
    with pytest.raises(ValueError, match=r"seed must be an integer >= 0, got -1"):
        load_examples("agnews", limit=3, seed=-1)
    with pytest.raises(ValueError, match=r"limit must be <= the 218 rows .*got 500"):
        load_examples("trec", limit=500)


def test_unsupported_extension(tmp_path):
    path = tmp_path / "ag.txt"
    path.write_text("text,label\nhello,1\n")
    with pytest.raises(ValueError, match=r"file extension must be one of .jsonl, .json, .csv, .parquet, got '.txt'"):
        load_examples("agnews", path)


@needs_datasets
def test_missing_column_names_the_file_the_column_and_the_columns_found(tmp_path, cache):
    path = _write_jsonl(tmp_path / "ag.jsonl", [{"sentence": "hello", "label": 1}])
    with pytest.raises(ValueError) as info:
        load_examples("agnews", path, cache_dir=cache)
    message = str(info.value)
    assert "ag.jsonl" in message and "'text'" in message and "['sentence', 'label']" in message
    trec = _write_jsonl(tmp_path / "trec.jsonl", [{"text": "Why?", "fine_label": 3}])
    with pytest.raises(ValueError, match=r"'coarse_label' or 'label-coarse', which is missing; columns found"):
        load_examples("trec", trec, cache_dir=cache)


@needs_datasets
@pytest.mark.parametrize(
    "label, pattern",
    [
        (4, r"integer label in \[0, 4\) \(World, Sports, Business, Sci/Tech\), got 4"),
        (-1, r"got -1"),
        ("Sports", r"must be an integer label in \[0, 4\), got 'Sports'"),
        (1.5, r"got 1.5"),
        (None, r"got None"),
        (True, r"got True"),
    ],
)
def test_bad_labels(tmp_path, cache, label, pattern):
    path = _write_jsonl(tmp_path / "ag.jsonl", [{"text": "fine", "label": 0}, {"text": "bad", "label": label}])
    with pytest.raises(ValueError, match=r"ag\.jsonl.*row 1: column 'label' " + ".*" + pattern):
        load_examples("agnews", path, cache_dir=cache)


@needs_datasets
def test_integral_float_labels_from_csv_are_accepted_but_blank_ones_are_not(tmp_path, cache):
    ok = tmp_path / "ok.jsonl"
    _write_jsonl(ok, [{"text": "a", "label": 2.0}])
    assert load_examples("agnews", ok, cache_dir=cache)[0].label == 2
    blank = _write_csv(tmp_path / "blank.csv", ["text", "label"], [["a", 1], ["b", ""]])
    with pytest.raises(ValueError, match=r"row 1: column 'label' must be an integer label.*got (None|nan)"):
        load_examples("agnews", blank, cache_dir=cache)


@needs_datasets
@pytest.mark.parametrize("text", ["", "   ", None, 7])
def test_empty_or_non_string_texts(tmp_path, cache, text):
    path = _write_jsonl(tmp_path / "ag.jsonl", [{"text": "fine", "label": 0}, {"text": text, "label": 1}])
    with pytest.raises(ValueError, match=r"row 1: column 'text' must be a non-empty string"):
        load_examples("agnews", path, cache_dir=cache)


@needs_datasets
def test_empty_summary_and_duplicate_ids(tmp_path, cache):
    rows = [{"id": "a", "document": "One. Two. Three.", "summary": " "}]
    with pytest.raises(ValueError, match=r"row 0: column 'summary' must be a non-empty string"):
        load_examples("xsum", _write_jsonl(tmp_path / "e.jsonl", rows), cache_dir=cache)
    rows = [{"id": "a", "document": "One.", "summary": "S."}, {"id": "a", "document": "Two.", "summary": "T."}]
    with pytest.raises(ValueError, match=r"unique ids, row 1 repeats 'a' of row 0"):
        load_examples("xsum", _write_jsonl(tmp_path / "d.jsonl", rows), cache_dir=cache)


@needs_datasets
def test_empty_and_unreadable_files(tmp_path, cache):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty\.jsonl' is empty.*no rows"):
        load_examples("agnews", empty, cache_dir=cache)
    header_only = _write_csv(tmp_path / "header.csv", ["text", "label"], [])
    with pytest.raises(ValueError, match=r"header\.csv'.*has no rows"):
        load_examples("agnews", header_only, cache_dir=cache)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a", "label": 1}\n{"text": oops}\n')
    with pytest.raises(ValueError, match=r"broken\.jsonl' could not be read as json"):
        load_examples("agnews", broken, cache_dir=cache)


@needs_datasets
def test_directory_without_or_with_ambiguous_split_files(tmp_path, cache):
    _write_jsonl(tmp_path / "train.jsonl", AG_ROWS)
    with pytest.raises(
        ValueError, match=r"hold a file for split 'test' named one of test\.jsonl.*found \['train\.jsonl'\]"
    ):
        load_examples("agnews", tmp_path, split="test", cache_dir=cache)
    _write_csv(tmp_path / "train.csv", ["text", "label"], [["x", 1]])
    with pytest.raises(ValueError, match=r"exactly one file for split 'train', found \['train\.jsonl', 'train\.csv'\]"):
        load_examples("agnews", tmp_path, cache_dir=cache)


def test_local_files_without_datasets_raise_import_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    path = _write_jsonl(tmp_path / "ag.jsonl", AG_ROWS)
    with pytest.raises(ImportError, match=r"'datasets' package is required for reading .*ag\.jsonl"):
        load_examples("agnews", path)
    assert len(load_examples("agnews")) >= 240  # the demo data needs only the standard library


# ----------------------------------------------------------------------------------------------------------------
# Records and audit contexts.


def test_example_invariants():
    with pytest.raises(ValueError, match="exactly one of label"):
        Example("x", 1, "y", "i")
    with pytest.raises(ValueError, match="exactly one of label"):
        Example("x", None, None, "i")
    with pytest.raises(ValueError, match=r"Example.text must be a non-empty string, got ''"):
        Example("", 1, None, "i")
    with pytest.raises(ValueError, match=r"Example.label must be an integer >= 0, got -2"):
        Example("x", -2, None, "i")


def _differences(a, b):
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]


@pytest.mark.parametrize("name, k", [("agnews", 1), ("trec", 4), ("samsum", 7), ("xsum", 5)])
def test_audit_context_is_a_pair_of_neighbouring_contexts(name, k):
    examples = load_examples(name)
    positions = set()
    for seed in range(40):
        ctx = sample_audit_context(examples, num_exemplars=k, seed=seed)
        c1, c0 = ctx.with_canary, ctx.without_canary
        assert len(c1) == len(c0) == k == ctx.num_exemplars
        assert _differences(c1, c0) == [ctx.position]
        assert (c1[ctx.position], c0[ctx.position]) == (ctx.canary, ctx.replacement)
        assert c0[: ctx.position] + c0[ctx.position + 1 :] == ctx.exemplars
        assert ctx.canary not in c0 and ctx.canary.text not in {e.text for e in c0}
        assert len({e.id for e in (ctx.canary, *c0)}) == k + 1
        positions.add(ctx.position)
        hash(ctx)
    assert positions == set(range(k)), "the canary's position must be drawn over all k slots"


def test_audit_context_is_deterministic_per_seed_and_varies_across_seeds():
    examples = load_examples("trec")
    first = sample_audit_context(examples, num_exemplars=5, seed=11)
    assert first == sample_audit_context(examples, num_exemplars=5, seed=11)
    others = {sample_audit_context(examples, num_exemplars=5, seed=s) for s in range(12, 20)}
    assert first not in others and len(others) == 8


def test_audit_context_ignores_duplicate_content_and_needs_enough_distinct_examples():
    a, b, c = (Example(t, 0, None, t) for t in "abc")
    a_copy = Example("a", 0, None, "a-copy")  # same content, other id: never both canary and exemplar
    pool = [a, a_copy, b, c]
    for seed in range(30):
        ctx = sample_audit_context(pool, num_exemplars=2, seed=seed)
        assert a_copy not in (ctx.canary, *ctx.without_canary)
    with pytest.raises(
        ValueError, match=r"at least num_exemplars \+ 1 = 4 distinct examples .*got 3 distinct out of 4"
    ):
        sample_audit_context(pool, num_exemplars=3, seed=0)
    with pytest.raises(ValueError, match=r"num_exemplars must be an integer >= 1, got 0"):
        sample_audit_context(pool, num_exemplars=0, seed=0)
    with pytest.raises(ValueError, match=r"seed must be an integer >= 0, got -3"):
        sample_audit_context(pool, num_exemplars=1, seed=-3)
    with pytest.raises(ValueError, match=r"item 1 is str"):
        sample_audit_context([a, "b"], num_exemplars=1, seed=0)


def test_audit_context_validates_its_fields():
    a, b, c = (Example(t, 0, None, t) for t in "abc")
    with pytest.raises(ValueError, match=r"position must be in \[0, 1\].*got 2"):
        AuditContext(canary=a, replacement=b, exemplars=(c,), position=2)
    with pytest.raises(ValueError, match="canary and replacement must differ"):
        AuditContext(canary=a, replacement=Example("a", 0, None, "other"), exemplars=(c,), position=0)
    ctx = AuditContext(canary=a, replacement=b, exemplars=(c,), position=0)
    assert (ctx.with_canary, ctx.without_canary) == ((a, c), (b, c))


# ----------------------------------------------------------------------------------------------------------------
# The reader of user data files: in memory, nothing written, strict.


def test_local_files_are_read_without_datasets_load_dataset_or_any_cache(tmp_path, cache, monkeypatch):
    """Power: the old path (datasets.load_dataset) would call the patched function and create ``cache``."""
    import datasets

    def refuse(*args, **kwargs):
        raise AssertionError("datasets.load_dataset must not read a local file (it copies it into a cache)")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    jsonl = _write_jsonl(tmp_path / "ag.jsonl", AG_ROWS)
    csv_path = _write_csv(tmp_path / "ag.csv", ["text", "label"], [[r["text"], r["label"]] for r in AG_ROWS])
    parquet = tmp_path / "ag.parquet"
    datasets.Dataset.from_dict({"text": [r["text"] for r in AG_ROWS], "label": [r["label"] for r in AG_ROWS]}) \
        .to_parquet(str(parquet))
    before = sorted(tmp_path.rglob("*"))
    for path in (jsonl, csv_path, parquet):
        assert load_examples("agnews", path, cache_dir=cache) == _ag_expected()
    assert sorted(tmp_path.rglob("*")) == before and not cache.exists()


def test_read_records_json_forms_give_the_same_columns(tmp_path):
    rows = [{"text": "a\u2028b", "label": 1}, {"label": 2.5, "extra": [1, {"k": None}]}, {"text": "c", "label": True}]
    expected = {"text": ["a\u2028b", None, "c"], "label": [1, 2.5, True], "extra": [None, [1, {"k": None}], None]}
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\r\n\n" for r in rows)  # CRLF, blank lines
    (tmp_path / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + lines.encode())  # with a byte-order mark
    (tmp_path / "b.json").write_text(json.dumps(rows, indent=2), encoding="utf-8")
    (tmp_path / "c.json").write_text(lines, encoding="utf-8")  # JSON Lines in a .json file
    for name in ("a.jsonl", "b.json", "c.json"):
        got = data.read_records(tmp_path / name)
        assert got == expected and list(got) == ["text", "label", "extra"], name
    (tmp_path / "one.json").write_text(json.dumps(rows[0], indent=2), encoding="utf-8")
    assert data.read_records(tmp_path / "one.json") == {"text": ["a\u2028b"], "label": [1]}
    (tmp_path / "none.json").write_text("[]")
    assert data.read_records(tmp_path / "none.json") == {}


def test_read_records_csv_types_and_missing_cells(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('id,text,score,mixed,,n\n007,"NA","1.5",1,x,-3\n8,"two\nlines",2,b,,\n\n9,null,,2.0,y,4\n',
                    encoding="utf-8")
    assert data.read_records(path) == {
        "id": [7, 8, 9], "text": ["NA", "two\nlines", "null"], "score": [1.5, 2.0, None], "mixed": ["1", "b", "2.0"],
        "Unnamed: 4": ["x", None, "y"], "n": [-3, None, 4],
    }
    header_only = _write_csv(tmp_path / "h.csv", ["text", "label"], [])
    assert data.read_records(header_only) == {"text": [], "label": []}


def test_read_records_parquet_keeps_the_column_values(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": ["x", None], "label": [3, 1], "tags": [["a"], []]}), path)
    assert data.read_records(path) == {"text": ["x", None], "label": [3, 1], "tags": [["a"], []]}


_THREADS = """
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
from snapaudit_jax.dpicl.data import read_records
count = lambda: len(os.listdir("/proc/self/task"))
before = count()
assert read_records(sys.argv[1])["text"] == ["x"] * 50
ours = count() - before
pq.read_table(pa.BufferReader(open(sys.argv[1], "rb").read()), use_threads=False)
print(ours, count() - before - ours, flush=True)
os._exit(0)  # the power check's pool thread may abort the interpreter's exit: the very fault under test
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc/self/task (Linux)")
def test_reading_parquet_starts_no_pyarrow_thread(tmp_path):
    """A pyarrow pool thread that releases the reader's buffer of Python bytes as the interpreter exits aborts the
    process ("terminate called without an active exception", exit -6; seen in a run that stopped with an input
    error after reading its data): records are read in the calling thread. Power: ``pq.read_table`` on the same
    bytes, even with ``use_threads=False``, starts one."""
    import subprocess

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": ["x"] * 50}), path)
    proc = subprocess.run([sys.executable, "-c", _THREADS, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[3])
    assert proc.returncode == 0, proc.stderr
    ours, read_table = map(int, proc.stdout.split())
    assert ours == 0 and read_table >= 1, proc.stdout


def _parquet_bytes(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["x"] * 50}), tmp_path / "good.parquet")
    return (tmp_path / "good.parquet").read_bytes()


@pytest.mark.parametrize("name, content, pattern", [
    ("dup.jsonl", '{"text": "a", "text": "b"}\n', r"line 1 is not valid JSON: key 'text' is repeated within one"),
    ("nan.jsonl", '{"text": "a", "label": NaN}\n', r"line 1 is not valid JSON: NaN is not valid JSON"),
    ("bad.jsonl", '{"text": "a"}\n{"text": oops}\n', r"line 2 is not valid JSON: Expecting value \(column 10\)"),
    ("list.jsonl", '{"text": "a"}\n[1, 2]\n', r"line 2 must be a JSON object, got list"),
    ("strings.json", '["a", "b"]', r"item 0 must be a JSON object, got str"),
    ("array.json", '[{"text": "a"},', r"not a valid JSON array"),
    ("surrogate.jsonl", '{"text": "a\\ud800b"}\n', r"line 1 holds a lone surrogate escape"),
    ("latin1.jsonl", b'{"text": "a"}\n{"text": "caf\xe9"}\n', r"must be UTF-8 text, byte 27 \(line 2\) is b'\\xe9'"),
    ("ragged.csv", "text,label\na,1\nb,2,3\n", r"line 3 has 3 field\(s\), the header has 2"),
    ("short.csv", "text,label\na\n", r"line 2 has 1 field\(s\), the header has 2"),
    ("repeated.csv", "text,text\na,b\n", r"the header repeats column\(s\) \['text'\]"),
    ("quote.csv", 'text,label\n"unterminated,1\n', r"could not be read as csv: line \d+: unexpected end of data"),
    ("latin1.csv", b"text,label\ncaf\xe9,1\n", r"could not be read as csv: it must be UTF-8 text"),
    ("junk.parquet", b"PAR1 not really parquet", r"could not be read as parquet"),
    ("truncated.parquet", "truncate", r"could not be read as parquet"),
    ("empty.csv", b"", r"empty\.csv' is empty \(no rows\)"),
    ("notes.txt", "text\n", r"file extension must be one of \.jsonl, \.json, \.csv, \.parquet, got '\.txt'"),
])
def test_read_records_refuses_what_breaks_its_format_and_quotes_no_record(tmp_path, name, content, pattern):
    if content == "truncate":
        content = _parquet_bytes(tmp_path)[:-30]
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=pattern) as info:
        data.read_records(path)
    assert name in str(info.value)
    assert "oops" not in str(info.value) and "caf" not in str(info.value) and "unterminated" not in str(info.value)


def test_read_records_refuses_what_is_not_a_regular_file(tmp_path):
    import os

    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)  # opening it for reading would block until a writer comes
    with pytest.raises(ValueError, match=r"pipe\.jsonl: the data file must be a regular file, got a FIFO \(named "
                                         r"pipe\) \(not opened\)"):
        data.read_records(fifo)
    with pytest.raises(ValueError, match=r"must be a regular file, got a FIFO"):
        load_examples("agnews", fifo)
    with pytest.raises(ValueError, match=r"the data file is a folder, not a file"):
        data.read_records(tmp_path)
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")  # endless: refused from its type, never read
    with pytest.raises(ValueError, match=r"zero\.jsonl: the data file must be a regular file, got a character device"):
        data.read_records(tmp_path / "zero.jsonl")
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl' does not exist"):
        data.read_records(tmp_path / "nope.jsonl")
    (tmp_path / "link.jsonl").symlink_to(_write_jsonl(tmp_path / "target.jsonl", AG_ROWS[:1]))
    assert data.read_records(tmp_path / "link.jsonl") == {"text": [AG_ROWS[0]["text"]], "label": [0]}
