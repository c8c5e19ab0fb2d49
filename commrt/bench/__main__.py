"""python -m commrt.bench NAME [options]: run one benchmark, or list them."""
import importlib
import pkgutil
import sys

import commrt.bench as _pkg


def available():
    return sorted(m.name for m in pkgutil.iter_modules(_pkg.__path__)
                  if not m.name.startswith("_"))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "list"):
        print("usage: python -m commrt.bench NAME [options]   (NAME --help for its options)\n")
        for name in available():
            doc = (importlib.import_module(f"commrt.bench.{name}").__doc__ or "").strip()
            print(f"  {name:<16} {doc.splitlines()[0] if doc else ''}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in available():
        print(f"unknown benchmark {name!r}; available: {', '.join(available())}", file=sys.stderr)
        return 2
    return importlib.import_module(f"commrt.bench.{name}").main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
