# Sourced by the multi-GPU scripts after bench/open_carry.sh, with CARRY set: when this machine's `mpirun` is not
# Open MPI 4 (the GPU image has none), runs the Open MPI 4.1 launcher that bench/make_carry.sh packed in
# apps/beamline/mpi, relocated with OPAL_PREFIX (PMIx's plugins by their MCA path), with Debian's default MCA settings
# (its /etc/openmpi file is not carried). Sets MPI_SOURCE to "this machine's" or "carried".
MPI_SOURCE="this machine's"
if ! mpirun --version 2>/dev/null | head -1 | grep -q 'Open MPI) 4\.' && [ -x "$CARRY/apps/beamline/mpi/bin/orterun" ]; then
  mpi_prefix=$(realpath "$CARRY/apps/beamline/mpi")
  export OPAL_PREFIX=$mpi_prefix PATH=$mpi_prefix/bin:$PATH \
    LD_LIBRARY_PATH=$(realpath "$CARRY/apps/beamline/lib"):$mpi_prefix/libs:$mpi_prefix/pmix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    PMIX_MCA_mca_base_component_path=$mpi_prefix/pmix/lib/pmix OMPI_MCA_btl_base_warn_component_unused=0 \
    OMPI_MCA_mtl='^ofi' OMPI_MCA_pml='^ucx' OMPI_MCA_osc='^ucx,pt2pt'
  MPI_SOURCE=carried
fi
