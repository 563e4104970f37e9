"""Open MPI's settings that a rank makes before MPI starts: each only where the user made none."""

import pytest

from hvd_mnist.runtime.world import distribution
from hvd_mnist.runtime.world.distribution import open_mpi_defaults


@pytest.fixture
def devices(tmp_path, monkeypatch):
    """An empty stand-in for /sys/class/infiniband."""
    monkeypatch.setattr(distribution, "FABRIC_DEVICES", str(tmp_path))
    return tmp_path


def test_without_a_fabric_the_cm_layer_is_skipped_and_waiting_yields(devices):
    environ = {}
    open_mpi_defaults(environ)
    assert environ == {"OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_pml": "^cm"}


def test_without_a_fabric_a_list_of_excluded_transports_excludes_ofi_too(devices):
    environ = {"OMPI_MCA_btl": "^openib"}  # what horovodrun passes to mpirun
    open_mpi_defaults(environ)
    assert environ["OMPI_MCA_btl"] == "^openib,ofi"


def test_a_list_of_chosen_transports_or_one_that_excludes_ofi_is_kept(devices):
    for btl in ("self,vader,tcp", "^ofi,openib", "^openib,ofi"):
        environ = {"OMPI_MCA_btl": btl}
        open_mpi_defaults(environ)
        assert environ["OMPI_MCA_btl"] == btl


def test_with_a_fabric_device_open_mpi_chooses_its_own_layers(devices):
    (devices / "mlx5_0").mkdir()
    environ = {"OMPI_MCA_btl": "^openib"}
    open_mpi_defaults(environ)
    assert "OMPI_MCA_pml" not in environ
    assert environ["OMPI_MCA_btl"] == "^openib"


def test_the_users_own_settings_are_kept(devices):
    environ = {"OMPI_MCA_pml": "cm", "OMPI_MCA_mpi_yield_when_idle": "0"}
    open_mpi_defaults(environ)
    assert environ == {"OMPI_MCA_pml": "cm", "OMPI_MCA_mpi_yield_when_idle": "0"}
