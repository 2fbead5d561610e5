"""The field types every spec section shares: element types, shapes, targets and the model base.

The decision this module protects: a spec section defined outside ``config.py`` (the table
sections in ``config_tables.py``) validates its dtypes and shapes exactly as the rest of the spec
does, because both take them from here; no section keeps its own copy of the list.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DTYPES", "Dtype", "Shape", "SpecModel", "Target"]

DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "complex64", "complex128")
Dtype = Literal["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                "complex64", "complex128"]
Target = Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")]
Shape = Annotated[tuple[Annotated[int, Field(ge=1)], ...], Field(max_length=8)]


class SpecModel(BaseModel):
    """A spec section: unknown fields refused, frozen, every field's docstring its description."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
