"""The K25 operator: EnginePool controller, autoscaling policy and its simulation."""
