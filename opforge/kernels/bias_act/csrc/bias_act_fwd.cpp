// bias_act's CPU forward loops (one per activation) and dtype conversions: a translation unit of their own, compiled in
// parallel with the others (see bias_act_loops.h).

#define BIAS_ACT_LOOPS
#include "bias_act_loops.h"

namespace opforge_bias_act {

FwdLoop OPFORGE_NS::fwd_loop_for(int act) { return Acts::fwd(act); }

LoadFn OPFORGE_NS::load_for(DType d) {
  return d == DType::F32 ? &load<DType::F32> : d == DType::BF16 ? &load<DType::BF16> : &load<DType::F16>;
}

StoreFn OPFORGE_NS::store_for(DType d) {
  return d == DType::F32 ? &store<DType::F32> : d == DType::BF16 ? &store<DType::BF16> : &store<DType::F16>;
}

}  // namespace opforge_bias_act
