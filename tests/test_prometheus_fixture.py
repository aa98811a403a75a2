from tests.fixtures.prometheus import PrometheusServer


def test_prometheus_scrapes_itself(prometheus_factory):
    prom: PrometheusServer = prometheus_factory()
    res = prom.wait_for('up{job="prometheus"} == 1', deadline_s=30)
    assert res[0]["value"][1] == "1"
    assert prom.query("vector(2) * 3")[0]["value"][1] == "6"
