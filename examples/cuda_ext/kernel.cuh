#pragma once
// The scale factor lives in a header so a test can change it and expect a rebuild.
#define AXPB_SCALE 2.0f
