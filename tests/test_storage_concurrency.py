"""Concurrent reading: a reader *process* queries the catalog while a writer *process* writes stage files
(the acceptance). DuckDB locks a read-write file against every other process, so this only
works because the writer never opens the catalog and files appear by atomic rename."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from arbor.storage.catalog import ensure_catalog

ROWS_PER_FILE = 7
N_FILES = 25
MIN_QUERIES = 100

READER = textwrap.dedent("""
    import json, os, sys
    from arbor.storage.sql import query
    home, progress, done_flag, out = sys.argv[1:5]
    counts, n, writer_done = [], 0, False
    while True:
        writer_done = os.path.exists(done_flag)  # checked before the query: the last query sees every file
        counts.append(query("select count(*) as n from trajectories", home=home).column("n")[0].as_py())
        n += 1
        with open(progress + ".tmp", "w") as fh:
            fh.write(str(n))
        os.replace(progress + ".tmp", progress)
        if writer_done and n >= {min_queries}:
            break
    json.dump(counts, open(out, "w"))
""").format(min_queries=MIN_QUERIES)

WRITER = textwrap.dedent("""
    import os, sys, time
    from arbor.storage.parquet import write_stage
    home, progress, done_flag = sys.argv[1:4]
    def reader_queries():
        try:
            return int(open(progress).read() or 0)
        except (FileNotFoundError, ValueError):
            return 0
    def rows(step, f1):
        return [dict(traj_id=f"w/{{step}}/0/{{s}}", group=0, sample=s, question_id="q", question="?", text="x" * 500,
                     format_valid=True, em=0.0, f1=f1, base_reward=f1) for s in range({rows})]
    for i in range({n_files}):
        while reader_queries() < 4 * i:  # interleave with the reader: it queries between our writes
            time.sleep(0.001)
        write_stage("trajectories", rows(i, 0.0), run_id="w", step=i, stage="rollout", home=home)
        if i % 5 == 4:  # re-write an earlier stage while the reader globs: replaced, never doubled
            write_stage("trajectories", rows(i - 1, 1.0), run_id="w", step=i - 1, stage="rollout", home=home)
    open(done_flag, "w").close()
""").format(rows=ROWS_PER_FILE, n_files=N_FILES)


def test_reader_process_sees_only_whole_files_while_writer_process_writes(tmp_path):
    home = tmp_path / "home"
    ensure_catalog(home)
    progress, done_flag, out = tmp_path / "progress", tmp_path / "writer.done", tmp_path / "counts.json"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(home), str(progress), str(done_flag), str(out)],
                              stderr=subprocess.PIPE, text=True)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(home), str(progress), str(done_flag)],
                              stderr=subprocess.PIPE, text=True)
    w_err = writer.communicate(timeout=120)[1]
    r_err = reader.communicate(timeout=120)[1]
    assert writer.returncode == 0, w_err
    assert reader.returncode == 0, r_err
    counts = json.loads(out.read_text())
    assert len(counts) >= MIN_QUERIES
    assert all(c % ROWS_PER_FILE == 0 for c in counts), [c for c in counts if c % ROWS_PER_FILE]  # no partial file
    assert counts == sorted(counts)  # files only ever appear; a re-written stage never vanishes or doubles
    assert counts[-1] == N_FILES * ROWS_PER_FILE
    assert len(set(counts)) >= N_FILES // 2  # the reader really ran while the writer wrote
