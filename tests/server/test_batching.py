import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tierserve.server.runtime.batching import DynamicBatcher
from tierserve.server.runtime.servables import RankingServable


class Doubler:
    """A predictor whose answer is a function of the row: 2 * sum(dense) + sum(keys)."""

    dense_dim, label_dim, slot_nums, max_batchsize = 3, 1, [2], 16

    def __init__(self):
        self.calls = []

    def predict_batch(self, batch):
        self.calls.append(batch.batch_size)
        keys = batch.sparse[0].keys.reshape(batch.batch_size, -1).sum(1)
        return (2 * batch.dense.sum(1) + keys)[:, None].astype(np.float32)


def test_concurrent_requests_merge_and_split_back():
    model = Doubler()
    servable = RankingServable("m", "1", model)
    seen = []
    batcher = DynamicBatcher(servable, ThreadPoolExecutor(1), max_delay_s=0.01,
                             on_batch=lambda rows, n: seen.append((rows, n)))  # fmt: skip

    async def one(i, rows):
        inputs = {
            "DES": np.full((rows, 3), i, np.float32),
            "CATCOLUMN": np.full((rows, 2), i, np.int64),
        }
        servable.check(inputs)
        out = await batcher.submit(servable.prepare(inputs))
        np.testing.assert_allclose(out["OUTPUT0"], np.full((rows, 1), 8.0 * i))
        return rows

    async def main():
        sizes = [1, 2, 3, 1, 5, 1, 1, 4, 2, 1]
        done = await asyncio.gather(*(one(i, r) for i, r in enumerate(sizes)))
        await batcher.close()
        return done

    assert sum(asyncio.run(main())) == 21
    assert max(model.calls) <= 16
    assert any(n > 1 for _, n in seen), seen  # requests were merged
    assert sum(rows for rows, _ in seen) == 21
