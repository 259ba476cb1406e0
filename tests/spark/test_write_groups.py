"""The sink's `group` column (spark.sink): each row goes to the group it names, as Kafka's
`topic` column; null rows to the `group` option; exactly once per group on a re-run."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from .helpers import Group, read_all, start_group

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    cluster, g = start_group(tmp_path_factory.mktemp("other"), "other")
    try:
        yield g
    finally:
        g.client.close()
        cluster.__exit__()


def _bodies(g: Group, start: int, tag: str) -> Counter[bytes]:
    return Counter(e.body for e in read_all(g.client, start) if e.body.startswith(tag.encode()))


def test_a_group_column_routes_each_row_and_a_rerun_appends_none_again(
        spark: SparkSession, group: Group, other: Group) -> None:
    tag = f"route-{uuid.uuid4().hex[:8]}"
    starts = (group.committed_next(), other.committed_next())
    # row i: to `other` when i % 3 == 0, to the live group by name when 1, null (the option's) when 2
    rows = [(f"{tag}-{i}", [other.name, group.name, None][i % 3]) for i in range(300)]
    df = spark.createDataFrame(rows, "body string, group string").repartition(3).sortWithinPartitions("body")
    routes = json.dumps({group.name: group.peers, other.name: other.peers})
    write_id = f"w-{tag}"
    for _ in range(2):  # the second run: the same rows under the same writeId, each group's answered
        df.write.format("dledger").mode("append").option("groups", routes).option("group", group.name) \
            .option("writeId", write_id).option("batchSize", "40").save()
    live, oth = _bodies(group, starts[0], tag), _bodies(other, starts[1], tag)
    assert set(live.values()) == {1} and set(oth.values()) == {1}
    assert set(oth) == {r[0].encode() for i, r in enumerate(rows) if i % 3 == 0}
    assert set(live) == {r[0].encode() for i, r in enumerate(rows) if i % 3 != 0}


def test_a_row_naming_a_group_outside_groups_fails_the_task(spark: SparkSession, group: Group, other: Group) -> None:
    tag = f"stray-{uuid.uuid4().hex[:8]}"
    start = group.committed_next()
    df = spark.createDataFrame([(f"{tag}-0", group.name), (f"{tag}-1", "nowhere")], "body string, group string")
    routes = json.dumps({group.name: group.peers, other.name: other.peers})
    with pytest.raises(Exception, match=r"names group 'nowhere', not among option groups"):
        df.coalesce(1).write.format("dledger").mode("append").option("groups", routes).save()
    with pytest.raises(Exception, match=r"null `group` and option groups names several"):
        spark.createDataFrame([(f"{tag}-2", None)], "body string, group string").write.format("dledger") \
            .mode("append").option("groups", routes).save()
    # with `peers`, every group is asked there: an unknown one is the members' refusal
    with pytest.raises(Exception, match=r"UNKNOWN_GROUP"):
        df.coalesce(1).write.format("dledger").mode("append").option("peers", group.peers).save()
    assert not [e for e in read_all(group.client, start) if e.body.startswith(f"{tag}-1".encode())]


def test_groups_without_a_group_column_is_refused(spark: SparkSession, group: Group) -> None:
    with pytest.raises(Exception, match=r"add a string column `group`"):
        spark.createDataFrame([("x",)], "body string").write.format("dledger").mode("append") \
            .option("groups", json.dumps({group.name: group.peers})).save()
    with pytest.raises(Exception, match=r"column `group` .* must be a string"):
        spark.createDataFrame([("x", 1)], "body string, group int").write.format("dledger").mode("append") \
            .option("peers", group.peers).save()


