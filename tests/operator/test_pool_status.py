from operators.autoscale_policy import ScalingDecision
from operators.pool_status import build_status, foreign_workload_status

NOW, EARLIER = "2026-01-01T00:01:00+00:00", "2026-01-01T00:00:00+00:00"
DEPLOYMENT = {"spec": {"replicas": 3}, "status": {"replicas": 3, "readyReplicas": 3}}
STEADY = ScalingDecision(3, "Steady", "240.0 QPS ...", ())
NO_GPU = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."


def pod(name="p", pool="h100", scheduled=True, deleting=False):
    metadata = {"name": name, "labels": {"k25.io/pool": pool}}
    if deleting:
        metadata["deletionTimestamp"] = EARLIER
    condition = {"type": "PodScheduled", "status": "True"} if scheduled else \
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": NO_GPU}
    return {"metadata": metadata, "status": {"conditions": [condition]}}


def conditions(status):
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_all_replicas_ready_is_ready():
    status = build_status("h100", "Deployment", DEPLOYMENT, [pod()], 240.0, STEADY, [], NOW)
    assert conditions(status) == {"Ready": ("True", "AllReplicasReady"), "Schedulable": ("True", "PodsScheduled"),
                                  "ScalingActive": ("True", "Steady")}
    assert (status["replicas"], status["readyReplicas"], status["desiredReplicas"]) == (3, 3, 3)
    assert (status["observedQPS"], status["selector"]) == (240.0, "k25.io/pool=h100")


def test_pods_without_a_gpu_node_are_not_ready_and_say_why():
    deployment = {"spec": {"replicas": 3}, "status": {"replicas": 3, "readyReplicas": 1}}
    status = build_status("h100", "Deployment", deployment, [pod(), pod("q", scheduled=False)], 240.0, STEADY, [], NOW)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Unschedulable")
    assert NO_GPU in ready["message"] and "1 of 3" in ready["message"]
    assert conditions(status)["Schedulable"] == ("False", "Unschedulable")


def test_other_pools_pods_and_leaving_pods_do_not_count():
    status = build_status("h100", "Deployment", DEPLOYMENT, [pod("a", pool="other", scheduled=False),
                                               pod("b", scheduled=False, deleting=True)], 1.0, STEADY, [], NOW)
    assert conditions(status)["Ready"] == ("True", "AllReplicasReady")


def test_starting_missing_and_zero():
    starting = {"spec": {"replicas": 3}, "status": {"replicas": 3, "readyReplicas": 1}}
    assert conditions(build_status("h100", "Deployment", starting, [], None, None, [], NOW))["Ready"] == ("False", "ReplicasStarting")
    assert conditions(build_status("h100", "Deployment", None, [], None, None, [], NOW))["Ready"] == ("False", "DeploymentMissing")
    zero = {"spec": {"replicas": 0}, "status": {}}
    assert conditions(build_status("h100", "Deployment", zero, [], 0.0, None, [], NOW))["Ready"] == ("False", "ScaledToZero")


def test_missing_qps_makes_scaling_inactive():
    decision = ScalingDecision(3, "QpsMissing", "no QPS data ...; holding the current size", ())
    status = build_status("h100", "Deployment", DEPLOYMENT, [], None, decision, [], NOW)
    assert conditions(status)["ScalingActive"] == ("False", "QpsMissing")
    assert status["observedQPS"] is None  # a null in the merge patch: an old value is cleared, not kept


def test_transition_time_moves_only_when_the_status_changes():
    previous = [{"type": "Ready", "status": "True", "reason": "AllReplicasReady", "lastTransitionTime": EARLIER},
                {"type": "Schedulable", "status": "False", "reason": "Unschedulable", "lastTransitionTime": EARLIER},
                {"type": "ScalingActive", "status": "True", "reason": "Steady", "lastTransitionTime": EARLIER}]
    status = build_status("h100", "Deployment", DEPLOYMENT, [], 1.0, None, previous, NOW)
    times = {c["type"]: c["lastTransitionTime"] for c in status["conditions"]}
    assert times == {"Ready": EARLIER, "Schedulable": NOW, "ScalingActive": EARLIER}  # kept until a decision


def test_a_predictive_decision_shows_its_forecast_and_horizon():
    decision = ScalingDecision(4, "ScaledUpForForecast", "...", (), forecast_qps=301.234, forecast_horizon_s=121.6)
    status = build_status("h100", "Deployment", DEPLOYMENT, [pod()], 240.0, decision, [], NOW)
    assert (status["forecastQPS"], status["forecastHorizonSeconds"]) == (301.23, 122)
    assert conditions(status)["ScalingActive"] == ("True", "ScaledUpForForecast")
    reactive = build_status("h100", "Deployment", DEPLOYMENT, [pod()], 240.0, STEADY, [], NOW)
    assert (reactive["forecastQPS"], reactive["forecastHorizonSeconds"]) == (None, None)


def test_without_a_deployment_no_decision_is_shown():
    status = build_status("h100", "Deployment", None, [], 12.0, None, [], NOW)
    assert (status["replicas"], status["readyReplicas"], status["desiredReplicas"]) == (0, 0, None)
    assert status["observedQPS"] == 12.0


def test_a_foreign_deployment_leaves_the_pool_without_replicas_and_says_whose_name_it_took():
    previous = build_status("h100", "Deployment", DEPLOYMENT, [pod()], 240.0, STEADY, [], EARLIER)["conditions"]
    status = foreign_workload_status("h100", "Deployment", previous, NOW)
    assert conditions(status) == {"Ready": ("False", "ForeignDeployment"), "Schedulable": ("Unknown", "ForeignDeployment"),
                                  "ScalingActive": ("False", "ForeignDeployment")}
    assert "Deployment h100-engine exists and is not owned by this EnginePool" in status["conditions"][0]["message"]
    assert (status["replicas"], status["readyReplicas"]) == (0, 0)
    # what `kubectl get enginepools` showed before is cleared
    assert [key for key, value in status.items() if value is None] == [
        "deployment", "leaderWorkerSet", "desiredReplicas", "observedQPS", "forecastQPS", "forecastHorizonSeconds"]
