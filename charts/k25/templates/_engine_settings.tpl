{{/* engine settings: written by `make engine-settings` from common/engine_settings.py: the EnginePool fields every pool may set and `engine` sets for all */}}
{{- define "k25.engineSettingFields" -}}dtype quant maxNumBatchedTokens maxNumSeqs gpuMemoryUtilization overtakeLimitS prefixCaching cudaGraphs kvHostTierGib kvDiskTierPath kvDiskTierGib kvTierRecencyWeight kvTierDecayPerS{{- end -}}
