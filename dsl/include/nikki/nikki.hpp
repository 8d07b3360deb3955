// nikki: an NKI-compatible kernel language for AWS NeuronCore. Include this to author kernels in
// C++: nikki::nl (nki.language), nikki::isa (nki.isa) and nikki::trace.
#pragma once

#include "nikki/dtype.hpp"
#include "nikki/error.hpp"
#include "nikki/ir.hpp"
#include "nikki/isa.hpp"
#include "nikki/nl.hpp"
#include "nikki/nl_init.hpp"
#include "nikki/target.hpp"
#include "nikki/tensor.hpp"
#include "nikki/trace.hpp"
