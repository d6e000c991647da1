from harness.lifecycle import Cluster, example, to_serving
from harness.waiting import until


async def test_smoke(cluster: Cluster, operator, kubectl) -> None:
    cluster.apply(example(validation__enabled=False))
    await until(lambda: len(cluster.jobs()) == 2, what="two build Jobs")
    await to_serving(cluster)
    await until(lambda: cluster.status()["serving"]["readyReplicas"] == 1, what="ready")
    print(cluster.samples[-3:], len(cluster.operator_writes()))
