"""Course tooling (every chapter): exercise generation from the package's marked solutions
(:mod:`~rlm_course.tools.exercisegen`), the exercise checks and the autograder
(:mod:`~rlm_course.tools.checks`, :mod:`~rlm_course.tools.grading`), the widget calculators
(:mod:`~rlm_course.tools.widgets`), plots (:mod:`~rlm_course.tools.plots`) and the benchmarks of
``python -m rlm_course bench`` (:mod:`~rlm_course.tools.bench`)."""
