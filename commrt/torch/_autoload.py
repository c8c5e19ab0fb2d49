"""The ``torch.backends`` entry point: ``import torch`` (>= 2.5) calls ``load()``.

It must never raise (a failing hook breaks every ``import torch`` in the
environment): any problem is a warning, and ``import commrt.torch`` by hand
gives the full error.  ``COMMRT_TORCH_AUTOLOAD=0`` turns it off.
"""


def load():
    try:
        from commrt import config

        if not config.get("COMMRT_TORCH_AUTOLOAD"):
            return
        import commrt.torch  # noqa: F401  (registers the backend and the tensor adapter)
    except Exception as exc:  # noqa: BLE001 - see the module text
        try:
            import warnings

            warnings.warn(f"commrt: the torch backend 'commrt' is unavailable: {exc!r} "
                          f"(import commrt.torch for details)", RuntimeWarning, stacklevel=2)
        except Exception:  # noqa: BLE001
            pass
