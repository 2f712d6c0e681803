// Scalars added to a stored sample after the fact (lifecycle.md section 6:
// Rollouts.AnnotateSamples), as the store takes them.
#ifndef ROLLPACK_SERVER_STORE_SCALAR_ANNOTATION_H_
#define ROLLPACK_SERVER_STORE_SCALAR_ANNOTATION_H_

#include <map>
#include <string>

namespace rollpack {

struct ScalarAnnotation {
  std::string sample_id;
  // Any names and values, as PutSamples takes a sample's scalars; a value is
  // compared bit for bit (SameScalars), so NaN again is the same value.
  std::map<std::string, double> scalars;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_SCALAR_ANNOTATION_H_
