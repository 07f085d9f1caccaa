// bias_act's CPU first-derivative loops (per activation and ref): a translation unit of their own, compiled in
// parallel with the others (see bias_act_loops.h).

#define BIAS_ACT_LOOPS
#include "bias_act_loops.h"

namespace opforge_bias_act {

GradLoop OPFORGE_NS::grad1_loop_for(int act, int ref) { return Acts::grad<1>(act, ref); }

}  // namespace opforge_bias_act
