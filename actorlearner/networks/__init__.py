"""Networks built from gymnasium spaces: observation encoders and branching Q heads."""

from actorlearner.networks.encoders import ObservationEncoder
from actorlearner.networks.heads import (
    ActionBranches,
    BranchingDuelingHead,
    action_branches,
    action_mask_key,
    mask_q,
)
from actorlearner.networks.leaves import (
    UnsupportedSpace,
    field_name,
    leaf_arrays,
    leaf_fields,
    leaf_spaces,
)

__all__ = [
    "ActionBranches", "BranchingDuelingHead", "ObservationEncoder", "UnsupportedSpace",
    "action_branches", "action_mask_key", "field_name", "leaf_arrays", "leaf_fields", "leaf_spaces", "mask_q",
]
