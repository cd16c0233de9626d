"""What the world-model projects share (rla-wm, tc-wm).

- ``papers_worldmodels.encoder``: the frozen ViT encoder (a tiny ``Dinov2Model`` stand-in, or a
  pretrained DINOv2/DINOv3 from a local folder) and the ViT input-size checks.
- ``papers_worldmodels.robomimic``: the robomimic HDF5 reader and writer.

Import the modules themselves; this package imports neither, so that importing it stays cheap and
leaves the order of the transformers import (see ``papers_worldmodels.encoder``) to the caller.
"""

from papers_worldmodels.errors import DataFormatError

__all__ = ["DataFormatError"]
