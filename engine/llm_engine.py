"""K25's engine: the engine core (engine/core/) over the model runner (engine/runner/) on one
device. This is what `k25 engine` serves and what in-process use (engine/offline.py) steps."""

from engine.base.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.model.loader import LoadedModel
from engine.runner.model_runner import ModelRunner


class LLMEngine(EngineCore):
    def __init__(self, model: LoadedModel, config: EngineConfig = EngineConfig()):
        runner = ModelRunner(model, config, adapters_in_use=lambda: self.scheduler.running_adapter_ids())
        super().__init__(config, runner, model.tokenizer)
        self.runner = runner
