"""Independent statements of what the writer must produce, for tests to compare against."""
import numpy as np

from writer import L5KIT_SCHEMA


def expected_tables(episodes, schema=L5KIT_SCHEMA):
    """Concatenate episodes, shifting each link's intervals by the child rows that came before."""
    out = {name: [] for name in schema.tables}
    offsets = {name: 0 for name in schema.tables}
    for ep in episodes:
        for name, arr in ep.items():
            arr = arr.copy()
            for link in schema.links_from(name):
                arr[link.field] += offsets[link.child]
            out[name].append(arr)
        for name, arr in ep.items():
            offsets[name] += len(arr)
    return {name: np.concatenate(parts) for name, parts in out.items()}
