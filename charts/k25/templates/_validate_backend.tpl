{{/* What one pool's engine backend serves, as the CRD and the operator check it
(operators/pool_spec.py, backend_refusal): K25's engine runs on one GPU of one node; vLLM's
takes none of the settings only K25's engine has. (dict "where" "engine.pools[0] (h100)" "pool" $pool
"compute" (its engine settings) "lora" (its merged lora)) */}}
{{- define "k25.validateBackend" -}}
{{- $gpus := int (include "k25.poolGpus" .pool) -}}
{{- if ne (toString .compute.backend) "vllm" -}}
{{- if gt $gpus 1 -}}
{{- fail (printf "%s: gpusPerReplica %d: K25's engine runs on one GPU; set backend: vllm to serve the model over several" .where $gpus) -}}
{{- end -}}
{{- if .compute.expertParallel -}}
{{- fail (printf "%s: expertParallel: K25's engine serves no mixture of experts; set backend: vllm" .where) -}}
{{- end -}}
{{- if gt (int (.compute.nodesPerReplica | default 1)) 1 -}}
{{- fail (printf "%s: nodesPerReplica %d: K25's engine runs on one node; set backend: vllm to serve the model over several" .where (int .compute.nodesPerReplica)) -}}
{{- end -}}
{{- else -}}
{{- if .compute.quant -}}
{{- fail (printf "%s: quant is K25's engine's: backend vllm serves the checkpoint's own quantisation; leave quant unset (the pool's and engine.quant)" .where) -}}
{{- end -}}
{{- if eq (toString .pool.maxChunkPerGpu) "auto" -}}
{{- fail (printf "%s: maxChunkPerGpu auto is K25's engine's: with backend vllm give a number" .where) -}}
{{- end -}}
{{- if and (not (hasKey .pool "maxChunkPerGpu")) (has .pool.nodeType (list "H200" "CPU")) (gt $gpus 0) -}}
{{- fail (printf "%s: maxChunkPerGpu is required with backend vllm on node type %s, which has no default: vLLM's KV cache is sized from it" .where .pool.nodeType) -}}
{{- end -}}
{{- if mod (int .pool.chunkSize) 32 -}}
{{- fail (printf "%s: chunkSize %v must be a multiple of 32 with backend vllm (its KV block)" .where .pool.chunkSize) -}}
{{- end -}}
{{- if and (gt (int .lora.maxLoras) 0) (eq .lora.kernel "triton") -}}
{{- fail (printf "%s: lora.kernel triton is K25's engine's: with backend vllm use torch" .where) -}}
{{- end -}}
{{- end -}}
{{- end -}}
