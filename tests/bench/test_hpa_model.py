"""The HPA baseline follows Kubernetes' replica calculator and default behaviour."""

from bench.hpa_model import HorizontalPodAutoscaler


def hpa(**kwargs) -> HorizontalPodAutoscaler:
    return HorizontalPodAutoscaler(**{"min_replicas": 1, "max_replicas": 100, "target_per_pod": 80.0, **kwargs})


def test_within_ten_percent_of_target_it_holds():
    assert hpa().step(0.0, 10 * 87, 10, 10) == 10
    assert hpa().step(0.0, 10 * 73, 10, 10) == 10


def test_beyond_the_tolerance_it_scales_to_ceil_of_usage_over_target():
    assert hpa().step(0.0, 10 * 89, 10, 10) == 12


def test_the_ratio_counts_every_pod_that_exists_ready_or_not():
    # 10 pods requested, 4 of them created but not ready: 870 QPS is 87 per pod, within tolerance
    assert hpa().step(0.0, 870, spec_replicas=10, status_replicas=10) == 10


def test_scale_up_is_limited_to_double_or_four_pods_per_fifteen_seconds():
    assert hpa().step(0.0, 8000, 2, 2) == 6  # +4 pods beats +100%
    assert hpa().step(0.0, 8000, 10, 10) == 20  # +100% beats +4 pods
    scaler = hpa()
    assert scaler.step(0.0, 8000, 10, 10) == 20
    assert scaler.step(10.0, 8000, 20, 20) == 20  # the period that started at 10 pods is not over
    assert scaler.step(16.0, 8000, 20, 20) == 40


def test_scale_down_takes_the_highest_recommendation_of_the_last_five_minutes():
    scaler = hpa()
    assert scaler.step(0.0, 1600, 20, 20) == 20
    assert scaler.step(15.0, 400, 20, 20) == 20
    assert scaler.step(299.0, 400, 20, 20) == 20
    assert scaler.step(301.0, 400, 20, 20) == 5


def test_bounds_and_missing_metrics():
    assert hpa(max_replicas=8).step(0.0, 8000, 6, 6) == 8
    assert hpa(min_replicas=3).step(0.0, 0, 3, 3) == 3
    assert hpa().step(0.0, None, 7, 7) == 7
    assert hpa().step(0.0, 800, 0, 0) == 0  # a Deployment scaled to zero is left alone
