"""The boundary between the Communicator and the collectives: the collectives
reach the Communicator only through its public attributes and ``comm.channel``
(commrt.comm.Channel), and comm.py imports no collective at load time."""
import ast
import pathlib

import commrt.comm as comm_mod

ROOT = pathlib.Path(comm_mod.__file__).resolve().parent
PRIVATE = {"_coll", "_derive", "_abort", "_exchange", "_irecv_reduce", "_exchange_chain",
           "_parent", "_engine", "_world", "_ctx"}


def test_the_collectives_use_no_private_part_of_the_communicator():
    offenders = []
    for path in sorted((ROOT / "collectives").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert not offenders, offenders


def test_comm_imports_no_collective_at_load_time():
    tree = ast.parse((ROOT / "comm.py").read_text())
    for node in tree.body:                      # module level only: methods import lazily
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("commrt.collectives"), node.module
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("commrt.collectives") for a in node.names)


def test_the_channel_lists_its_methods():
    doc = comm_mod.Channel.__doc__
    for name in ("isend", "irecv", "irecv_reduce", "exchange", "exchange_chain", "abort",
                 "derive", "parent"):
        assert hasattr(comm_mod.Channel, name) and name in doc, name
