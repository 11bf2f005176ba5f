"""The node agent: discovers this host's GPUs with NVML, samples them, attributes the processes
on them to workloads and reports the samples to the portal API (``gpuportal agent``)."""
