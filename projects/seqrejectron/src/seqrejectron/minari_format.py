"""Real offline data: a reader for Minari's on-disk format and a JSON shift spec of MuJoCo edits.

Minari stores a dataset as ``<root>/<dataset_id>/data/main_data.hdf5`` with one group per
episode, ``episode_<id>``, holding ``observations`` (T+1 rows; a dataset, or a group of datasets
for dict observations), ``actions`` (T rows), ``rewards``, ``terminations`` and
``truncations`` (T flags). Ids need not be contiguous. This reader needs only h5py (the
``minari`` package itself is not required); it flattens dict observations in sorted key order.

The shift spec (JSON) lists edits of a MuJoCo model for the test dynamics::

    {"edits": [{"element": "body", "name": "particle", "field": "mass", "scale": 2.0},
               {"element": "actuator", "name": "motor_x", "field": "gear", "scale": 0.5},
               {"element": "opt", "field": "wind", "value": [0.5, 0.0, 0.0]}]}

Mass and inertia edits change derived constants (``body_invweight0``...), so ``apply_shift``
calls ``mujoco.mj_setConst`` after editing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from papers_data import DatasetNotFoundError

HOW_TO_GET = (
    "Put a Minari dataset folder there (e.g. copied from ~/.minari/datasets/<dataset_id>, made "
    "with `minari download` on a machine with internet); it must hold data/main_data.hdf5."
)
ELEMENTS = ("body", "geom", "actuator", "dof", "jnt", "opt")
NEEDS_SET_CONST = {"mass", "inertia", "ipos", "iquat"}


class ShiftSpecError(ValueError):
    user_facing = True


class MinariFormatError(ValueError):
    user_facing = True


@dataclass
class Episode:
    id: int
    observations: np.ndarray  # [T + 1, D]
    actions: np.ndarray  # [T, ...]
    rewards: np.ndarray  # [T]
    terminated: bool
    truncated: bool


def flatten_observations(node) -> np.ndarray:
    """A dataset as [T+1, D]; a group (dict observation) flattened in sorted key order."""
    if hasattr(node, "keys"):
        parts = [flatten_observations(node[key]) for key in sorted(node.keys())]
        lengths = {len(p) for p in parts}
        if len(lengths) != 1:
            raise MinariFormatError(
                f"dict observation keys have different lengths {sorted(lengths)}"
            )
        return np.concatenate(parts, axis=1)
    array = np.asarray(node[()], dtype=np.float32)
    return array.reshape(len(array), -1)


def load_minari(root: str | Path, dataset_id: str) -> list[Episode]:
    """Every episode of ``<root>/<dataset_id>/data/main_data.hdf5``, sorted by id."""
    import h5py

    path = Path(root) / dataset_id / "data" / "main_data.hdf5"
    if not path.is_file():
        raise DatasetNotFoundError(
            dataset_id,
            Path(root),
            [f"{dataset_id}/data/main_data.hdf5"],
            HOW_TO_GET,
            missing=[str(path)],
        )
    episodes = []
    with h5py.File(path, "r") as f:
        names = [k for k in f if k.startswith("episode_")]
        for name in sorted(names, key=lambda k: int(k.split("_")[1])):
            group = f[name]
            observations = flatten_observations(group["observations"])
            actions = np.asarray(group["actions"][()])
            terminations = np.asarray(group["terminations"][()], dtype=bool)
            truncations = np.asarray(group["truncations"][()], dtype=bool)
            if len(observations) != len(actions) + 1:
                raise MinariFormatError(
                    f"{name}: {len(observations)} observations for {len(actions)} actions "
                    "(Minari stores T+1 observations for T actions)"
                )
            episodes.append(
                Episode(
                    id=int(name.split("_")[1]),
                    observations=observations,
                    actions=actions,
                    rewards=np.asarray(group["rewards"][()], dtype=np.float32),
                    terminated=bool(terminations[-1]) if len(terminations) else False,
                    truncated=bool(truncations[-1]) if len(truncations) else False,
                )
            )
    if not episodes:
        raise MinariFormatError(f"{path} holds no episode_<id> groups")
    return episodes


def check_same_observation_space(train: list[Episode], test: list[Episode]) -> None:
    if not test:
        raise MinariFormatError("the unlabelled test set is empty")
    a, b = train[0].observations.shape[1], test[0].observations.shape[1]
    if a != b:
        raise MinariFormatError(
            f"test trajectories have {b}-dimensional observations, train {a}: another "
            "observation space"
        )


def read_shift_spec(path: str | Path) -> dict:
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ShiftSpecError(f"cannot read the shift spec {path}: {error}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("edits"), list):
        raise ShiftSpecError(f"{path}: the shift spec needs a list under 'edits'")
    return spec


def apply_shift(model, spec: dict):
    """Apply the spec's edits to a ``mujoco.MjModel`` in place; returns the model.

    Each edit names an element kind, an element name (not for ``opt``), a field, and either
    ``scale`` or ``value``. An unknown kind, element or field is a ShiftSpecError naming it.
    """
    import mujoco

    set_const = False
    for edit in spec["edits"]:
        element, field = edit.get("element"), edit.get("field")
        if element not in ELEMENTS:
            raise ShiftSpecError(f"unknown element kind '{element}'; choose one of {ELEMENTS}")
        if element == "opt":
            target, attribute = model.opt, field
            if not hasattr(target, str(field)):
                raise ShiftSpecError(f"MuJoCo's model.opt has no field '{field}'")
            current = np.asarray(getattr(target, attribute), dtype=float)
            row = None
        else:
            attribute = f"{element}_{field}"
            if not hasattr(model, attribute):
                raise ShiftSpecError(f"MuJoCo's model has no field '{attribute}' (from {edit})")
            kind = {"jnt": mujoco.mjtObj.mjOBJ_JOINT, "dof": mujoco.mjtObj.mjOBJ_JOINT}.get(
                element, getattr(mujoco.mjtObj, f"mjOBJ_{element.upper()}", None)
            )
            row = mujoco.mj_name2id(model, kind, str(edit.get("name")))
            if row < 0:
                raise ShiftSpecError(f"the model has no {element} named '{edit.get('name')}'")
            if element == "dof":
                row = int(model.jnt_dofadr[row])
            target = getattr(model, attribute)
            current = np.asarray(target[row], dtype=float)
        if "scale" in edit:
            new = current * float(edit["scale"])
        elif "value" in edit:
            new = np.asarray(edit["value"], dtype=float)
            if new.shape != current.shape and new.size != current.size:
                raise ShiftSpecError(f"{attribute} has shape {current.shape}, got {new.shape}")
        else:
            raise ShiftSpecError(f"edit {edit} needs 'scale' or 'value'")
        if row is None:
            setattr(target, attribute, new.reshape(current.shape))
        else:
            target[row] = new.reshape(current.shape)
        set_const |= field in NEEDS_SET_CONST
    if set_const:
        mujoco.mj_setConst(model, mujoco.MjData(model))
    return model
