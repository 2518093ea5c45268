module fsdp-gitops/tools/cluster/pause

go 1.24.0
