"""Write a model safely: to a temporary file in the destination folder, renamed into place.

A crash or a refused verification never leaves a half-written model, and the input file is never
the destination unless the caller asked for that explicitly.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import onnx
import onnx_ir as ir

from onnx_lnfold.core.errors import CannotWrite, InvalidInput
from onnx_lnfold.core.ir import graphs_of, weight_bytes
from onnx_lnfold.core.progress import Progress
from onnx_lnfold.io import scratch
from onnx_lnfold.io.external_data import release_mapped, save_with_external_data, uses_external_data
from onnx_lnfold.io.proto_write import read_from, write_model

# Protobuf cannot hold a message over 2 GiB: above this the weights go to external data.
_PROTO_LIMIT = 2**31 - 2**26


def _proto_initializers(graph: onnx.GraphProto):
    """The initializers of a GraphProto and of the bodies of its nodes, at any depth."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _proto_initializers(sub)


def _os_error(what: str, e: OSError) -> CannotWrite:
    return CannotWrite(f"{what}: {e.strerror or e}")


class StagedModel:
    """A model written next to its destination, not yet in place: `commit()` or `discard()`.

    The model goes to `destination`, its weights (when external, or too large for one protobuf) to
    `destination.name + '.data'` beside it; both are written into a temporary folder inside the
    destination folder and renamed into place by `commit()`, the data file first. A data file the
    input model still reads (in-place runs) is replaced only by that rename, so memory maps of the
    old file stay valid. With `rebind`, the model's initializers are switched to the written
    files: external data at once, the weights streamed into a one-file model at `commit()`
    (in-memory edits are released; the model stays usable after, even if its source is gone).

    With `copy_of` (the file `model` was read from, a model nothing changed that has no external
    data), that file's bytes are written instead of a serialization of `model`: an unchanged copy
    (`identical`), where a re-serialization would differ in bytes (value_info, node names).

    `commit(metadata)` adds `metadata_props` entries known only once the model is written (the
    verdict of a check that read the staged file), without writing the model again.
    """

    def __init__(
        self,
        model: ir.Model,
        destination: Path,
        *,
        progress: Progress | None = None,
        rebind: bool = False,
        copy_of: Path | None = None,
    ):
        self.destination = destination
        folder = destination.parent
        check_output_folder(folder)
        try:
            self._dir = scratch.make("staging", folder, hidden=True)
        except OSError as e:
            raise _os_error(f"{folder}: cannot write to the output folder", e) from None
        self.path = self._dir / destination.name
        self.data_name: str | None = None
        self._model = model
        self._rebind_on_commit = rebind
        self._rebound: list[ir.ExternalTensor] = []
        self._streamed: dict[str, int] = {}  # one-file output: where streamed initializers start
        self.identical = copy_of is not None
        # The metadata_props entries the written model holds (an unchanged copy's are its input's).
        self._written_metadata = {} if copy_of is not None else dict(model.metadata_props)
        with self._discarded_on_failure(f"{destination}: cannot write the output"):
            if copy_of is not None:
                shutil.copyfile(copy_of, self.path)
                return
            release_mapped(model)
            if uses_external_data(model) or weight_bytes(model) > _PROTO_LIMIT:
                self.data_name = destination.name + ".data"
            callback = None
            if progress is not None and progress.enabled:
                callback = progress.save_callback(f"Writing {self.data_name or destination.name}", weight_bytes(model))
            if self.data_name:
                save_with_external_data(model, self.path, self.data_name, callback)
            else:  # one protobuf file, large weights streamed into it
                self._streamed = write_model(model, self.path, callback)
            if progress is not None:
                progress.finish()
            if rebind and self.data_name:
                self._rebind()

    @contextmanager
    def _discarded_on_failure(self, what: str) -> Iterator[None]:
        """Within it, any failure removes what was staged; an OSError is raised as `CannotWrite`
        beginning with `what`."""
        try:
            yield
        except OSError as e:
            self.discard()
            raise _os_error(what, e) from None
        except BaseException:
            self.discard()
            raise

    @property
    def data_path(self) -> Path | None:
        return self._dir / self.data_name if self.data_name else None

    def _rebind(self) -> None:
        """Point the model's external-data initializers at the staged data file."""
        proto = onnx.load(str(self.path), load_external_data=False)
        initializers = {name: value for graph in graphs_of(self._model) for name, value in graph.initializers.items()}
        for init in _proto_initializers(proto.graph):
            value = initializers.get(init.name)
            if init.data_location != onnx.TensorProto.EXTERNAL or value is None or value.const_value is None:
                continue
            info = {e.key: e.value for e in init.external_data}
            old = value.const_value
            tensor = ir.ExternalTensor(
                info["location"],
                int(info.get("offset", 0)),
                int(info["length"]) if "length" in info else None,
                old.dtype,
                shape=ir.Shape(old.shape),
                name=value.name,
                base_dir=str(self._dir),
            )
            if isinstance(old, ir.ExternalTensor):
                try:
                    old.release()
                except BufferError:
                    pass
            value.const_value = tensor
            self._rebound.append(tensor)

    def _append_metadata(self, metadata: Mapping[str, str]) -> dict[str, str]:
        """Append `metadata`'s entries the written file lacks to it, and return them. A serialized
        ModelProto followed by another parses as their merge, a repeated field's entries in order:
        a ModelProto holding only these entries, appended, adds them to `metadata_props` as if
        written there, and the weights before them stay where they are."""
        if self.identical:
            raise ValueError("an unchanged copy of the input is the input's bytes: it takes no metadata")
        conflicts = sorted(k for k, v in metadata.items() if self._written_metadata.get(k, v) != v)
        if conflicts:
            raise ValueError(
                f"the written model already holds {', '.join(map(repr, conflicts))} with another value: set or drop "
                "such entries in the model before it is staged (appending cannot replace an entry)"
            )
        new = {k: v for k, v in metadata.items() if k not in self._written_metadata}
        if new:
            entries = [onnx.StringStringEntryProto(key=k, value=v) for k, v in new.items()]
            with open(self.path, "ab") as file:
                file.write(onnx.ModelProto(metadata_props=entries).SerializeToString())
            self._written_metadata.update(new)
        return new

    def commit(self, metadata: Mapping[str, str] | None = None) -> Path:
        """Move the output into place (its data file first); on failure nothing is left staged.

        `metadata`: `metadata_props` entries appended to the written file first, and set on the
        model in memory once it is in place. Where the written model holds a key already, it must
        hold the same value (ValueError otherwise: appending cannot replace an entry, and a key
        twice fails onnx.checker); an unchanged copy (`identical`) takes none."""
        folder = self.destination.parent
        with self._discarded_on_failure(f"{self.destination}: cannot write the output"):
            added = self._append_metadata(metadata) if metadata else {}
        try:
            if self.data_name:
                os.replace(self._dir / self.data_name, folder / self.data_name)
            os.replace(self.path, self.destination)
        except OSError as e:
            self.discard()
            raise _os_error(f"{self.destination}: cannot move the output into place", e) from None
        self._model.metadata_props.update(added)
        for tensor in self._rebound:  # maps already open follow the renamed file; new ones find it here
            tensor.base_dir = str(folder)
        if self._rebind_on_commit and self._streamed:
            read_from(self._model, self.destination, self._streamed)
        shutil.rmtree(self._dir, ignore_errors=True)
        return self.destination

    def discard(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


def default_output(path: Path) -> Path:
    """`model.onnx` -> `model.lnfold.onnx`, beside the input."""
    return path.with_name(f"{path.stem}.lnfold{path.suffix or '.onnx'}")


def check_output_folder(folder: Path) -> None:
    """Raise `CannotWrite` where `folder` cannot take the output."""
    if not folder.exists():
        raise CannotWrite(f"{folder}: output folder does not exist")
    if not folder.is_dir():
        raise CannotWrite(f"{folder}: output folder is not a folder")
    if not os.access(folder, os.W_OK):
        raise CannotWrite(f"{folder}: output folder is not writable")


def check_destination(
    source: Path | None, destination: Path, in_place: bool, input_data: set[Path] | frozenset[Path] = frozenset()
) -> None:
    """Refuse a destination that would overwrite the input model or a data file it reads, or whose
    folder cannot take it (`check_output_folder`): before the model is read, not after the fold.

    `input_data`: the resolved external data files of the input. With `in_place` the output
    replaces the input model, and its data file (`OUT.onnx.data`) may replace the input's (it is
    written under a temporary name and renamed after: the input is read to the end first).
    """
    target = destination.resolve()
    same = source is not None and target == source.resolve()
    if same and not in_place:
        raise InvalidInput(f"{destination}: output would overwrite the input; pass --in-place to allow it")
    if destination.is_dir():
        raise InvalidInput(f"{destination}: output path is a directory")
    check_output_folder(destination.parent)
    if target in input_data:
        raise InvalidInput(f"{destination}: output would overwrite the input's external data file")
    data = target.with_name(target.name + ".data")
    if not same and source is not None and data == source.resolve():
        raise InvalidInput(
            f"{destination}: its data file {data.name} would overwrite the input model; choose another output name"
        )
    if data in input_data and not same:
        raise InvalidInput(
            f"{destination}: its data file {data.name} would overwrite the input's external data file; choose another output name"
        )
