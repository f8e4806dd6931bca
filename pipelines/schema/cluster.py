"""What a config needs of the cluster it runs on, checked once Ray is up."""

from __future__ import annotations

from asymvlm import storage
from asymvlm.errors import ConfigError

__all__ = ["check_shared_output"]


def check_shared_output(output: str, shared_filesystem: bool) -> None:
    """On a Ray cluster of more than one node, a local ``output`` must be declared shared: Ray
    Train uploads checkpoints from whichever node reports them, and every stage reads back what
    another node wrote. Call after Ray is up, before any work."""
    import ray

    if storage.is_remote(output) or shared_filesystem or not ray.is_initialized():
        return
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) > 1:
        raise ConfigError(
            f"output {output} is a local path, but this Ray cluster has {len(nodes)} nodes: "
            "shared storage is needed. Use an object store (--output s3://bucket/run) or a "
            "mount every node shares, declared with storage.shared_filesystem=true"
        )
