# The Debian package (scripts/package.sh; docs/packaging.md): `cpack -G DEB` in the build folder writes
# beamline_<version>_amd64.deb. Everything private to beamline lives in /usr/lib/beamline: the binary, the
# shared libraries it carries (cpp-httplib and Open MPI, which src/loadgen and src/parallel copy to
# apps/beamline/lib and which it finds through RUNPATH $ORIGIN/lib, as in the build folder) and the default model
# under models/, where `beamline serve` without --model looks (the folders above the binary). /usr/bin/beamline
# links to it; the systemd unit reads its arguments from /etc/default/beamline.
include(GNUInstallDirs)
set(BEAMLINE_PACKAGE_DIR lib/beamline)

set_property(TARGET beamline PROPERTY INSTALL_RPATH "\$ORIGIN/lib")
install(TARGETS beamline RUNTIME DESTINATION ${BEAMLINE_PACKAGE_DIR})
install(DIRECTORY ${PROJECT_BINARY_DIR}/apps/beamline/lib/ DESTINATION ${BEAMLINE_PACKAGE_DIR}/lib)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/models/beam-nano ${PROJECT_SOURCE_DIR}/models/beam-nano-drafter
        DESTINATION ${BEAMLINE_PACKAGE_DIR}/models)
file(MAKE_DIRECTORY ${PROJECT_BINARY_DIR}/packaging)
file(CREATE_LINK ../lib/beamline/beamline ${PROJECT_BINARY_DIR}/packaging/beamline SYMBOLIC)
install(FILES ${PROJECT_BINARY_DIR}/packaging/beamline DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/packaging/beamline.service DESTINATION lib/systemd/system)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/beamline.default DESTINATION /etc/default RENAME beamline)
install(FILES ${PROJECT_SOURCE_DIR}/README.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME beamline)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "OpenAI-compatible LLM inference server (CPU and CUDA)")
set(CPACK_PACKAGE_DESCRIPTION
    "beamline serves Harmony-format models over vLLM's OpenAI-compatible HTTP API, with the default model\
 beam-nano and a systemd unit (beamline.service, arguments in /etc/default/beamline).")
set(CPACK_PACKAGE_CONTACT "beamline developers <beamline@localhost>")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # beamline_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION net)
# Depends from the binary's and the carried libraries' needs (dpkg-shlibdeps); the carried ones are resolved in
# the package itself.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/apps/beamline/lib)
# The settings file is the administrator's: an upgrade keeps their edits.
file(WRITE ${PROJECT_BINARY_DIR}/packaging/conffiles "/etc/default/beamline\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/packaging/conffiles)
include(CPack)
