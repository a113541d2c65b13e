"""What the operator is told at start."""

import urllib.parse
from dataclasses import dataclass

# kopf keeps this finalizer on every resource we handle (the timers and delete handlers ask for it)
FINALIZER = "k25.io/operator"
# an operator handles only the EnginePools and AdapterRollouts that carry its release in this label
RELEASE_LABEL = "k25.io/release"
# the key of the Redis Secret that holds the URL (with its password) which every k25 process reads
# as K25_REDIS_URL; the Helm chart makes that Secret
REDIS_URL_KEY = "redis-url"
# the key of the transport Secret that holds the release's CURVE key (common/zmq_curve.py), which the
# gateway, the chunker and the engines read as K25_CURVE_SECRET_KEY; the Helm chart makes that Secret
CURVE_SECRET_KEY_KEY = "curve-secret-key"
# during a rotation (operators/curve_rotation.py) the same Secret's second key, which processes read as
# K25_CURVE_SECRET_KEY_NEXT or K25_CURVE_SECRET_KEY_PREVIOUS: the key coming, or the key going
CURVE_NEXT_KEY_KEY = "curve-secret-key-next"
CURVE_PREVIOUS_KEY_KEY = "curve-secret-key-previous"
# where the engines find the CA of a Redis that speaks TLS (the chart's redis.tls): the key ca.crt of
# the Secret named by redis_ca_secret, which their URL's ssl_ca_certs names
REDIS_CA_DIR = "/etc/k25/redis-tls"


@dataclass(frozen=True)
class OperatorConfig:
    release: str = "k25"  # prefix of every Redis key, and the release label of the pools it handles
    redis_url: str = "redis://127.0.0.1:6379/0"  # where the operator reads QPS
    # the Secret (key REDIS_URL_KEY) that the engines read their Redis URL from; None: the engines
    # get redis_url as a plain value, which is refused when the URL carries a password
    redis_secret: str | None = None
    # the Secret (key CURVE_SECRET_KEY_KEY) that the engines read their CURVE key from; None: CURVE
    # off, the engines admit any peer
    curve_secret: str | None = None
    # the Secret whose key ca.crt the engines mount at REDIS_CA_DIR; None: no CA mounted
    redis_ca_secret: str | None = None
    interval_s: float = 5.0  # between autoscaling decisions
    qps_window_s: int = 10  # QPS is the mean over this many complete seconds
    foreign_recheck_s: float = 30.0  # how often to look whether a foreign workload has gone, or the LWS API come
    # repositories (or `prefix/*`) whose images EnginePools may run (operators/image_policy.py); (): any
    allowed_images: tuple[str, ...] = ()

    def __post_init__(self):
        if self.redis_secret is None and urllib.parse.urlsplit(self.redis_url).password:
            raise ValueError("the Redis URL carries a password: name the Secret that holds it (--redis-secret, "
                             f"key {REDIS_URL_KEY}) so that the engines do not get it in plain text")
