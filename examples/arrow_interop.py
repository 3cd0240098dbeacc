"""polars and DuckDB on a zarrfeed dataset: through the Arrow C stream, and through a Parquet export.

Run: python examples/arrow_interop.py [DATASET]   (default: a small synthetic dataset in a temporary folder)
"""
import sys
import tempfile
from pathlib import Path

import duckdb
import polars as pl
from zarrfeed.loader import Dataset, export_parquet
from zarrfeed.writer import synthetic, write_dataset

if __name__ == "__main__":  # workers import this script again (see "Start methods" in docs/guides/loading.md)
    tmp = Path(tempfile.mkdtemp())
    path = sys.argv[1] if len(sys.argv) > 1 else tmp / "scenes.zarr"
    if len(sys.argv) == 1:
        write_dataset(path, synthetic.episodes(3, seed=0), workers=2)
    ds = Dataset.open(path)

    # 1. A stream straight into polars and DuckDB (no files, no pandas): frames with their agents as list<struct>.
    frames = ds.to_batches("frames", join={"agents": "agent_index_interval"})
    df = pl.DataFrame(frames)
    print("polars, agents per frame:", df.select(pl.col("agents").list.len()).describe().row(2))

    agents = ds.to_batches("agents")
    sql = "SELECT count(*) AS agents, max(track_id) AS tracks FROM agents"
    print("DuckDB over the stream:", duckdb.sql(sql).fetchall())

    # 2. A Parquet export, one folder per table, with a `_row` column for joining interval fields in SQL.
    out = tmp / "parquet"
    export_parquet(ds, out, workers=2)
    speed = duckdb.sql(f"""
        SELECT s._row AS scene, round(avg(sqrt(a.velocity[1] ^ 2 + a.velocity[2] ^ 2)), 3) AS mean_speed
        FROM read_parquet('{out}/agents/*.parquet') a
        JOIN read_parquet('{out}/frames/*.parquet') f
          ON a._row >= f.agent_index_interval[1] AND a._row < f.agent_index_interval[2]
        JOIN read_parquet('{out}/scenes/*.parquet') s
          ON f._row >= s.frame_index_interval[1] AND f._row < s.frame_index_interval[2]
        GROUP BY scene ORDER BY scene""").fetchall()
    print("DuckDB on Parquet, mean agent speed per scene:", speed)
    labels = pl.read_parquet(f"{out}/agents/*.parquet").group_by(
        pl.col("label_probabilities").arr.arg_max().alias("label")).len().sort("label")
    print("polars on Parquet, agents per label:", labels.rows())
