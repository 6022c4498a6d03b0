// File paths from Python: a str, bytes or any os.PathLike (pathlib.Path) becomes the bytes the system
// would be given (os.fsencode), so that the library, not the binding, checks them (an embedded NUL is
// its gaac.GaacError, not a truncated name). Anything else is a TypeError.
#pragma once

#include <nanobind/nanobind.h>

#include <string>

namespace gaac::python {

/// A path argument: its bytes as os.fsencode gives them.
struct PathArg {
  std::string bytes;
};

}  // namespace gaac::python

namespace nanobind::detail {

/// str | bytes | os.PathLike → PathArg (the stub shows `str | os.PathLike[str]`).
template <>
struct type_caster<gaac::python::PathArg> {
  NB_TYPE_CASTER(gaac::python::PathArg, const_name("str | os.PathLike[str]"))

  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    PyObject* path = PyOS_FSPath(src.ptr());  // str or bytes; TypeError for other types
    if (path == nullptr) {
      PyErr_Clear();
      return false;
    }
    PyObject* encoded = PyUnicode_Check(path) ? PyUnicode_EncodeFSDefault(path) : (Py_INCREF(path), path);
    Py_DECREF(path);
    if (encoded == nullptr || !PyBytes_Check(encoded)) {
      Py_XDECREF(encoded);
      PyErr_Clear();
      return false;
    }
    value.bytes.assign(PyBytes_AS_STRING(encoded), static_cast<size_t>(PyBytes_GET_SIZE(encoded)));
    Py_DECREF(encoded);
    return true;
  }

  static handle from_cpp(const gaac::python::PathArg& p, rv_policy, cleanup_list*) noexcept {
    return PyUnicode_DecodeFSDefaultAndSize(p.bytes.data(), static_cast<Py_ssize_t>(p.bytes.size()));
  }
};

}  // namespace nanobind::detail
