"""Build script: the package layout (kernels/ and launcher/ install as
commrt.kernels and commrt.launcher), the compiled transport core and the
kernels' C combine loops."""
import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

SOURCE_DIRS = ("commrt", "kernels", "launcher")


class build_ext_and_bytecode(build_ext):
    """An in-place build (``pip install -e .``) also writes the packages'
    bytecode, as a regular install does: under PYTHONDONTWRITEBYTECODE
    nothing else would, and every rank of every job would compile commrt's
    modules from source again (~30 ms of CPU per rank at start-up)."""

    def run(self):
        super().run()
        if self.inplace:
            import compileall
            for folder in SOURCE_DIRS:
                compileall.compile_dir(folder, quiet=1)

packages = find_packages(include=["commrt", "commrt.*"])
packages += ["commrt.kernels"] + ["commrt.kernels." + p for p in find_packages("kernels")]
packages += ["commrt.launcher"] + ["commrt.launcher." + p for p in find_packages("launcher")]

extensions = [
    Extension(
        "commrt.transport._core",
        ["commrt/transport/_core.pyx"],
        include_dirs=["commrt/transport/includes", numpy.get_include()],
        extra_compile_args=["-O3", "-Wno-unused-function", "-Wno-unreachable-code"],
    ),
    Extension(
        "commrt.collectives._entry",
        ["commrt/collectives/_entry.pyx"],
        include_dirs=[numpy.get_include()],        # the array struct's accessors only
        extra_compile_args=["-O3", "-Wno-unused-function"],
    ),
    Extension(
        "commrt.kernels._combine",
        ["kernels/_combine.pyx"],
        include_dirs=["kernels"],
        extra_compile_args=["-O3", "-fwrapv", "-Wno-unused-function"],
    ),
]

setup(
    cmdclass={"build_ext": build_ext_and_bytecode},
    packages=packages,
    package_dir={"commrt.kernels": "kernels", "commrt.launcher": "launcher"},
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False,
                             "cdivision": True, "initializedcheck": False},
        include_path=["commrt/transport", "commrt/transport/includes"],
    ),
)
